use super::*;

struct Fixed;
impl Handler for Fixed {
    fn get(&self, path: &str) -> Response {
        if path == "/x" {
            Response::json(b"[1]".to_vec())
        } else {
            Response::text(404, "no\n")
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_and_client_reads() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(serve(l, Arc::new(Fixed)));
    let a = addr.clone();
    let body = tokio::task::spawn_blocking(move || get(&a, "/x?y=1")).await.unwrap().unwrap();
    assert_eq!(body, b"[1]");
    let err = tokio::task::spawn_blocking(move || get(&addr, "/nope")).await.unwrap().unwrap_err();
    assert!(err.contains("404"), "{err}");
}

#[test]
fn unreachable_daemon_names_the_fix() {
    let err = get("127.0.0.1:1", "/api/v1/destinations").unwrap_err();
    assert!(err.contains("observer run"), "{err}");
}
