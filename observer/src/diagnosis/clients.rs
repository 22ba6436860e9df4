//! The client side of the catalog: for each client runtime observer can
//! tell ([`crate::kernel::runtime`]), the setting that bounds its pool's
//! idle time, and the default where one exists, each with its source.
//! [`fix_settings`] turns a row's runtimes, the protocols its connections
//! showed and its measured path timeout into the fix in the client's own
//! words; a runtime's default above the path's timeout is a finding of its
//! own. Never another library's knob: a library's setting is named only
//! where that library was seen in the process, and only on a row whose
//! protocol it speaks.

use serde::{Deserialize, Serialize};

use crate::kernel::{first_bytes::Protocol, runtime::ClientRuntime};

/// One pool setting of one client runtime.
#[derive(Debug, Clone, Copy)]
pub struct ClientKnob {
    /// `go`, `jvm`, `node`, `python`, `nginx`, `haproxy`, `envoy`.
    pub runtime: &'static str,
    /// The library it belongs to (`None`: the runtime's own, named only
    /// where no library of the runtime was seen).
    pub library: Option<&'static str>,
    /// The protocols its connections speak (empty: any). A row is told
    /// this knob only where its connections showed one of them: a Go
    /// binary has `net/http` linked in whatever it connects to, and its
    /// Postgres row is no place for `IdleConnTimeout`.
    pub protocols: &'static [Protocol],
    /// How people name the client.
    pub client: &'static str,
    /// The setting, as its documentation spells it.
    pub setting: &'static str,
    /// Its default idle time, seconds; `None`: no idle timeout of its own.
    pub default_seconds: Option<f64>,
    /// Defaults that changed with the runtime's major version: from
    /// version `v` on, `seconds` (the latest first entry at or below the
    /// process's version wins). A runtime whose version is not known then
    /// has no default stated (`default_seconds` is ignored).
    pub defaults_from: &'static [(u32, f64)],
    /// What to do, with `{rec}` for the recommended seconds.
    pub advice: &'static str,
    pub source: &'static str,
}

/// Every HTTP a connection's first bytes show.
const HTTP: &[Protocol] = &[Protocol::Http1, Protocol::H2, Protocol::Http];

/// The catalog, one entry per pool setting.
pub const CLIENTS: &[ClientKnob] = &[
    ClientKnob {
        runtime: "go",
        library: Some("net/http"),
        protocols: HTTP,
        client: "Go net/http",
        setting: "http.Transport.IdleConnTimeout",
        default_seconds: Some(90.0),
        defaults_from: &[],
        advice: "set IdleConnTimeout on the http.Transport to at most {rec} (http.DefaultTransport keeps idle connections 90 s)",
        source: "pkg.go.dev/net/http#Transport (DefaultTransport: IdleConnTimeout 90 s)",
    },
    ClientKnob {
        runtime: "go",
        library: Some("database/sql"),
        protocols: &[],
        client: "Go database/sql",
        setting: "sql.DB.SetConnMaxIdleTime",
        default_seconds: None,
        defaults_from: &[],
        advice: "call db.SetConnMaxIdleTime with at most {rec} (by default idle connections are kept without limit)",
        source: "pkg.go.dev/database/sql#DB.SetConnMaxIdleTime",
    },
    ClientKnob {
        runtime: "go",
        library: Some("pgx"),
        protocols: &[],
        client: "Go pgx pool",
        setting: "pgxpool.Config.MaxConnIdleTime",
        default_seconds: Some(1800.0),
        defaults_from: &[],
        advice: "set MaxConnIdleTime (pool_max_conn_idle_time in the connection string) to at most {rec}",
        source: "pkg.go.dev/github.com/jackc/pgx/v5/pgxpool#Config (default 30 min)",
    },
    ClientKnob {
        runtime: "jvm",
        library: Some("okhttp"),
        protocols: HTTP,
        client: "OkHttp",
        setting: "ConnectionPool keepAliveDuration",
        default_seconds: Some(300.0),
        defaults_from: &[],
        advice: "build the ConnectionPool with keepAliveDuration at most {rec}",
        source: "square.github.io/okhttp ConnectionPool (default 5 idle connections, 5 min)",
    },
    ClientKnob {
        runtime: "jvm",
        library: Some("httpclient"),
        protocols: HTTP,
        client: "Apache HttpClient",
        setting: "HttpClientBuilder.evictIdleConnections",
        default_seconds: None,
        defaults_from: &[],
        advice: "call evictIdleConnections with at most {rec} (by default idle connections are not evicted)",
        source: "hc.apache.org HttpClientBuilder#evictIdleConnections",
    },
    ClientKnob {
        runtime: "jvm",
        library: Some("hikaricp"),
        protocols: &[],
        client: "HikariCP",
        setting: "idleTimeout / keepaliveTime",
        default_seconds: Some(600.0),
        defaults_from: &[],
        advice: "set idleTimeout to at most {rec}, or keepaliveTime below it so idle connections are kept alive",
        source: "github.com/brettwooldridge/HikariCP configuration (idleTimeout default 600000 ms)",
    },
    ClientKnob {
        runtime: "jvm",
        library: Some("java.net.http"),
        protocols: HTTP,
        client: "JDK java.net.http HttpClient",
        setting: "jdk.httpclient.keepalive.timeout (system property, seconds)",
        default_seconds: None,
        defaults_from: &[(11, 1200.0), (20, 30.0)],
        advice: "start the JVM with -Djdk.httpclient.keepalive.timeout=N, N at most {rec} (it applies to every HttpClient in the JVM; set it on the command line or in JAVA_TOOL_OPTIONS, before any HttpClient is built)",
        source: "docs.oracle.com java.net.http module summary; JDK-8297030 (1200 s through JDK 19, 30 s from JDK 20)",
    },
    ClientKnob {
        runtime: "node",
        library: None,
        protocols: &[Protocol::Http1],
        client: "Node.js http.Agent",
        setting: "agentkeepalive freeSocketTimeout",
        default_seconds: None,
        defaults_from: &[],
        advice: "http.Agent has no idle timeout of its own: use agentkeepalive with freeSocketTimeout at most {rec}",
        source: "nodejs.org/api/http.html#class-httpagent; npmjs.com/package/agentkeepalive",
    },
    ClientKnob {
        runtime: "python",
        library: None,
        protocols: &[Protocol::Http1],
        client: "Python urllib3 / requests",
        setting: "(none: urllib3 has no pool idle timeout)",
        default_seconds: None,
        defaults_from: &[],
        advice: "urllib3 reuses a pooled connection however long it was idle: retry the first failure on a fresh connection (urllib3 Retry, idempotent requests), or close the pool after {rec} idle",
        source: "urllib3.readthedocs.io (connectionpool: no idle timeout)",
    },
    ClientKnob {
        runtime: "nginx",
        library: None,
        protocols: &[],
        client: "nginx upstream",
        setting: "keepalive_timeout (in the upstream block)",
        default_seconds: Some(60.0),
        defaults_from: &[],
        advice: "set keepalive_timeout in the upstream block to at most {rec}",
        source: "nginx.org/en/docs/http/ngx_http_upstream_module.html#keepalive_timeout",
    },
    ClientKnob {
        runtime: "haproxy",
        library: None,
        protocols: &[],
        client: "HAProxy",
        setting: "timeout http-keep-alive / pool-purge-delay",
        default_seconds: Some(5.0),
        defaults_from: &[],
        advice: "keep pool-purge-delay (and timeout http-keep-alive) at most {rec}",
        source: "docs.haproxy.org configuration (pool-purge-delay default 5 s)",
    },
    ClientKnob {
        runtime: "envoy",
        library: None,
        protocols: &[],
        client: "Envoy cluster",
        setting: "common_http_protocol_options.idle_timeout",
        default_seconds: Some(3600.0),
        defaults_from: &[],
        advice: "set the cluster's common_http_protocol_options.idle_timeout to at most {rec}",
        source: "envoyproxy.io HttpProtocolOptions.idle_timeout (default 1 h)",
    },
    ClientKnob {
        runtime: "python",
        library: Some("grpcio"),
        protocols: &[Protocol::H2],
        client: "gRPC Python (grpcio)",
        setting: "grpc.client_idle_timeout_ms (channel option)",
        default_seconds: Some(1800.0),
        defaults_from: &[],
        advice: "set the channel option grpc.client_idle_timeout_ms to at most {rec}, so the channel drops an idle connection before the path does; grpc.keepalive_time_ms below the path's timeout keeps a NAT's or an L4 balancer's flow alive, not a proxy's own idle timeout",
        source: "grpc.github.io/grpc/core/group__grpc__arg__keys.html (GRPC_ARG_CLIENT_IDLE_TIMEOUT_MS, default 30 min)",
    },
    ClientKnob {
        runtime: "go",
        library: Some("grpc-go"),
        protocols: &[Protocol::H2],
        client: "grpc-go",
        setting: "grpc.WithIdleTimeout",
        default_seconds: Some(1800.0),
        defaults_from: &[],
        advice: "dial with grpc.WithIdleTimeout at most {rec}; keepalive.ClientParameters.Time below the path's timeout keeps a NAT's or an L4 balancer's flow alive, not a proxy's own idle timeout",
        source: "pkg.go.dev/google.golang.org/grpc#WithIdleTimeout (default 30 min)",
    },
    ClientKnob {
        runtime: "jvm",
        library: Some("grpc-java"),
        protocols: &[Protocol::H2],
        client: "grpc-java",
        setting: "ManagedChannelBuilder.idleTimeout",
        default_seconds: Some(1800.0),
        defaults_from: &[],
        advice: "build the channel with idleTimeout at most {rec}; keepAliveTime below the path's timeout keeps a NAT's or an L4 balancer's flow alive, not a proxy's own idle timeout",
        source: "grpc.github.io/grpc-java/javadoc/io/grpc/ManagedChannelBuilder.html#idleTimeout (default 30 min)",
    },
];

/// The fix for one client runtime, in its own terms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FixSetting {
    /// How people name the client (`Go net/http`), or `unknown`.
    pub client: String,
    /// The setting to change.
    pub setting: String,
    /// Its default idle time, seconds (null: no idle timeout of its own,
    /// or unknown).
    pub default_seconds: Option<f64>,
    /// What to do, with the recommended number.
    pub advice: String,
    /// The default itself exceeds the path's timeout: "Go net/http's
    /// default 90 s > the path's 60 s".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finding: Option<String>,
}

fn secs(v: f64) -> String {
    crate::units::fmt_secs(v)
}

/// The fixes for a row's clients: per runtime seen, the knobs of the
/// libraries seen in it, else the runtime's own knob, each only where the
/// row's protocols (`protocols`, empty: unknown) fit it; the generic rule
/// for clients that could not be told or whose library was not seen. A
/// row whose protocol is unknown (`protocols` empty) is told no
/// protocol's knob. `path` is the path's timeout (point, else upper bound), `rec` the
/// recommended pool idle timeout.
#[must_use]
pub fn fix_settings(
    runtimes: &[ClientRuntime],
    unknown: bool,
    protocols: &[Protocol],
    path: Option<f64>,
    rec: Option<f64>,
) -> Vec<FixSetting> {
    let Some(rec) = rec else { return Vec::new() };
    let speaks = |k: &&ClientKnob| k.protocols.is_empty() || protocols.iter().any(|p| k.protocols.contains(p));
    let mut out: Vec<FixSetting> = Vec::new();
    let mut untold = unknown;
    let unreadable = runtimes.iter().any(|r| r.unreadable);
    for rt in runtimes.iter().filter(|r| !r.is_unknown()) {
        let of_runtime = || CLIENTS.iter().filter(|k| k.runtime == rt.runtime).filter(speaks);
        let mut fits: Vec<&ClientKnob> =
            of_runtime().filter(|k| k.library.is_some_and(|l| rt.libraries.iter().any(|x| x == l))).collect();
        if fits.is_empty() {
            fits = of_runtime().filter(|k| k.library.is_none()).collect();
        }
        untold |= fits.is_empty();
        for k in fits {
            if out.iter().any(|f| f.client == k.client) {
                continue;
            }
            let default = if k.defaults_from.is_empty() {
                k.default_seconds
            } else {
                rt.version.and_then(|v| k.defaults_from.iter().rev().find(|(from, _)| v >= *from).map(|(_, d)| *d))
            };
            let finding = match (default, path) {
                (Some(d), Some(p)) if d > p => {
                    Some(format!("{}'s default {} > the path's {}", k.client, secs(d), secs(p)))
                }
                _ => None,
            };
            out.push(FixSetting {
                client: k.client.to_owned(),
                setting: k.setting.to_owned(),
                default_seconds: default,
                advice: k.advice.replace("{rec}", &secs(rec)),
                finding,
            });
        }
    }
    if untold || unreadable || out.is_empty() {
        out.push(FixSetting {
            client: "unknown".to_owned(),
            setting: if unreadable {
                "the client pool's idle timeout (runtime unknown: not readable with these capabilities; its executable is not one the daemon's user may open: a directory closed to it, or a container's file system)".to_owned()
            } else {
                "the client pool's idle timeout".to_owned()
            },
            default_seconds: None,
            advice: format!(
                "set the client pool's idle timeout to at most {} (0.8 x the path's timeout), with a maximum connection lifetime; retry once on a fresh connection when no request byte reached the peer",
                secs(rec)
            ),
            finding: None,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jdk_client_by_its_version() {
        let jdk = |v: Option<u32>| ClientRuntime { version: v, ..rt("jvm", &["java.net.http"]) };
        let f = fix_settings(&[jdk(Some(17))], false, &[Protocol::Http1], Some(2.0), Some(1.6));
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].setting, "jdk.httpclient.keepalive.timeout (system property, seconds)");
        assert_eq!(f[0].default_seconds, Some(1200.0));
        assert!(f[0].advice.contains("-Djdk.httpclient.keepalive.timeout=N, N at most 1.6 s"), "{}", f[0].advice);
        assert_eq!(f[0].finding.as_deref(), Some("JDK java.net.http HttpClient's default 1200 s > the path's 2 s"));
        let f = fix_settings(&[jdk(Some(21))], false, &[Protocol::Http], Some(60.0), Some(48.0));
        assert_eq!((f[0].default_seconds, f[0].finding.as_deref()), (Some(30.0), None));
        // The version unknown: no default claimed, so no finding.
        let f = fix_settings(&[jdk(None)], false, &[Protocol::H2], Some(2.0), Some(1.6));
        assert_eq!((f[0].default_seconds, f[0].finding.as_deref()), (None, None));
    }

    /// A client whose executable the daemon may not read: the row says so
    /// beside the generic rule.
    #[test]
    fn an_unreadable_runtime_says_so() {
        let f = fix_settings(&[ClientRuntime::unreadable()], false, &[], Some(2.0), Some(1.6));
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].client, "unknown");
        assert!(f[0].setting.contains("not readable with these capabilities"), "{}", f[0].setting);
        let f = fix_settings(&[ClientRuntime::unknown()], true, &[], Some(2.0), Some(1.6));
        assert!(!f[0].setting.contains("capabilities"), "{}", f[0].setting);
    }

    fn rt(r: &str, libs: &[&str]) -> ClientRuntime {
        ClientRuntime {
            runtime: r.into(),
            libraries: libs.iter().map(|l| (*l).to_owned()).collect(),
            ..ClientRuntime::default()
        }
    }

    #[test]
    fn go_default_above_the_path_is_a_finding() {
        let f = fix_settings(&[rt("go", &["net/http"])], false, &[Protocol::Http], Some(5.0), Some(4.0));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].setting, "http.Transport.IdleConnTimeout");
        assert_eq!(f[0].default_seconds, Some(90.0));
        assert!(f[0].advice.contains("at most 4 s"), "{}", f[0].advice);
        assert_eq!(f[0].finding.as_deref(), Some("Go net/http's default 90 s > the path's 5 s"));
        // A path longer than the default: no finding.
        let f = fix_settings(&[rt("go", &["net/http"])], false, &[Protocol::Http1], Some(120.0), Some(96.0));
        assert_eq!(f[0].finding, None);
    }

    /// Nearly every Go binary links `net/http`: on a row whose connections
    /// showed no HTTP (a database), its knob is not told; the database
    /// driver's is.
    #[test]
    fn go_net_http_only_on_http_rows() {
        let go = rt("go", &["net/http", "pgx"]);
        let f = fix_settings(std::slice::from_ref(&go), false, &[], Some(5.0), Some(4.0));
        assert_eq!(f.iter().map(|k| k.client.as_str()).collect::<Vec<_>>(), vec!["Go pgx pool"], "{f:?}");
        let f = fix_settings(&[go], false, &[Protocol::H2], Some(5.0), Some(4.0));
        assert!(f.iter().any(|k| k.client == "Go net/http"), "{f:?}");
    }

    #[test]
    fn python_unknown_and_no_number() {
        let f = fix_settings(&[rt("python", &[])], false, &[Protocol::Http1], Some(5.0), Some(4.0));
        assert!(f[0].client.starts_with("Python") && f[0].advice.contains("Retry"), "{f:?}");
        // A Python process on a row that showed no HTTP (Redis, say): not
        // urllib3's rule.
        let f = fix_settings(&[rt("python", &[])], false, &[], Some(5.0), Some(4.0));
        assert_eq!(f.iter().map(|k| k.client.as_str()).collect::<Vec<_>>(), vec!["unknown"], "{f:?}");
        let f = fix_settings(&[], true, &[], Some(5.0), Some(4.0));
        assert_eq!(f[0].client, "unknown");
        assert!(f[0].advice.contains("at most 4 s"), "{}", f[0].advice);
        let f = fix_settings(&[rt("go", &[])], false, &[], Some(5.0), Some(4.0));
        assert_eq!(f.len(), 1, "a Go binary whose pool library was not seen: the generic rule only: {f:?}");
        assert_eq!(f[0].client, "unknown");
        assert!(fix_settings(&[rt("go", &[])], false, &[], None, None).is_empty(), "no number, no fix");
    }

    #[test]
    fn never_another_librarys_knob() {
        // A grpcio client on an h2 row: gRPC's knob, not urllib3's.
        let f = fix_settings(&[rt("python", &["grpcio"])], false, &[Protocol::H2], Some(3.0), Some(2.4));
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].setting, "grpc.client_idle_timeout_ms (channel option)");
        assert!(f[0].advice.contains("at most 2.4 s"), "{}", f[0].advice);
        assert_eq!(f[0].finding.as_deref(), Some("gRPC Python (grpcio)'s default 1800 s > the path's 3 s"));
        // The same process on an HTTP/1 row (it loaded grpcio, but this
        // row's connections are not gRPC): Python's HTTP/1 rule, as for
        // any Python HTTP client, never grpcio's.
        let f = fix_settings(&[rt("python", &["grpcio"])], false, &[Protocol::Http1], Some(3.0), Some(2.4));
        assert_eq!(f.iter().map(|k| k.client.as_str()).collect::<Vec<_>>(), vec!["Python urllib3 / requests"]);
        // Python without grpcio on an h2 row (h2c from an unknown library):
        // urllib3 speaks HTTP/1 only.
        let f = fix_settings(&[rt("python", &[])], false, &[Protocol::H2], Some(3.0), Some(2.4));
        assert_eq!(f[0].client, "unknown", "{f:?}");
        // A JVM with no pool library on its class path and no JDK client
        // thread: not OkHttp's, HttpClient's or HikariCP's.
        let f = fix_settings(&[rt("jvm", &[])], false, &[], Some(2.0), Some(1.6));
        assert_eq!(f.iter().map(|k| k.client.as_str()).collect::<Vec<_>>(), vec!["unknown"]);
        for (runtime, lib, setting) in
            [("go", "grpc-go", "grpc.WithIdleTimeout"), ("jvm", "grpc-java", "ManagedChannelBuilder.idleTimeout")]
        {
            let f = fix_settings(&[rt(runtime, &[lib])], false, &[Protocol::H2], Some(3.0), Some(2.4));
            assert_eq!(f.iter().map(|k| k.setting.as_str()).collect::<Vec<_>>(), vec![setting]);
        }
    }
}
