//! A JVM's pool libraries and JDK version, from what any user may read:
//! the jar files of the class path it was started with (never a substring
//! of its command line: `-Djdk.httpclient...` names no library), the
//! JDK's own `java.net.http` client by its threads, and the JDK's major
//! version by the `release` file beside an executable whose path is known.

use super::ClientRuntime;

/// JVM pool libraries: (name, how their jar file's name starts).
const JVM_LIBRARIES: &[(&str, &str)] =
    &[("okhttp", "okhttp"), ("httpclient", "httpclient"), ("hikaricp", "hikaricp"), ("grpc-java", "grpc-api")];

/// The JDK's own client starts one thread per `HttpClient` with this
/// name prefix (`HttpClient-1-SelectorManager`); its default executor's
/// workers share it.
const JDK_HTTPCLIENT_THREAD: &str = "HttpClient-";

/// Class path entries and threads looked at, at most.
const MAX_ENTRIES: usize = 4096;

/// The jar files of a JVM's class path, from its command line (NUL
/// separated, as `/proc/PID/cmdline` gives it): the values of `-cp`,
/// `-classpath`, `--class-path` and `-jar`, split at `:`; a `dir/*`
/// entry is the directory's jars, listed (bounded). Lowercased file names.
fn class_path_jars(cmdline: &[u8]) -> Vec<String> {
    let args: Vec<String> = cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let mut entries: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let value = match a.as_str() {
            "-cp" | "-classpath" | "--class-path" | "-jar" => it.next().cloned(),
            other => other.strip_prefix("--class-path=").map(str::to_owned),
        };
        entries.extend(value.iter().flat_map(|v| v.split(':').map(str::to_owned)));
        if entries.len() >= MAX_ENTRIES {
            break;
        }
    }
    let mut jars = Vec::new();
    for e in entries.iter().take(MAX_ENTRIES) {
        if let Some(dir) = e.strip_suffix("/*").or_else(|| (e == "*").then_some(".")) {
            let Ok(listing) = std::fs::read_dir(dir) else { continue };
            jars.extend(listing.take(MAX_ENTRIES).flatten().map(|f| f.file_name().to_string_lossy().to_lowercase()));
        } else if let Some(name) = std::path::Path::new(e).file_name() {
            jars.push(name.to_string_lossy().to_lowercase());
        }
    }
    jars.retain(|j| std::path::Path::new(j).extension().is_some_and(|e| e.eq_ignore_ascii_case("jar")));
    jars
}

/// Whether one of `pid`'s threads is named with `prefix` (thread names are
/// readable by any user).
fn has_thread(pid: u32, prefix: &str) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks
        .take(MAX_ENTRIES)
        .flatten()
        .any(|t| std::fs::read(t.path().join("comm")).is_ok_and(|c| String::from_utf8_lossy(&c).starts_with(prefix)))
}

/// The JDK's major version from the `release` file of the JDK whose
/// `bin/java` is `java` (`JAVA_VERSION="17.0.15"`, or `"1.8.0_392"`).
fn jdk_major(java: &std::path::Path) -> Option<u32> {
    use std::io::Read as _;
    let home = java.parent()?.parent()?;
    let mut text = String::new();
    std::fs::File::open(home.join("release")).ok()?.take(64 << 10).read_to_string(&mut text).ok()?;
    let v = text.lines().find_map(|l| l.strip_prefix("JAVA_VERSION="))?.trim_matches('"');
    let mut parts = v.split(['.', '_', '-', '+']);
    match parts.next()?.parse().ok()? {
        1 => parts.next()?.parse().ok(),
        major => Some(major),
    }
}

/// A JVM: its class path's libraries, the JDK's client by its threads,
/// and the JDK's version where its executable's path is known (`exe`, or
/// an absolute `argv[0]`).
pub(super) fn jvm(pid: u32, exe: Option<&std::path::Path>) -> ClientRuntime {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let jars = class_path_jars(&cmdline);
    let mut libraries: Vec<String> = JVM_LIBRARIES
        .iter()
        .filter(|(_, prefix)| jars.iter().any(|j| j.starts_with(prefix)))
        .map(|(l, _)| (*l).to_owned())
        .collect();
    if has_thread(pid, JDK_HTTPCLIENT_THREAD) {
        libraries.push("java.net.http".to_owned());
    }
    let argv0 =
        cmdline.split(|&b| b == 0).next().map(|a| std::path::PathBuf::from(String::from_utf8_lossy(a).as_ref()));
    let java = exe.map(std::path::Path::to_path_buf).or(argv0.filter(|a| a.is_absolute()));
    ClientRuntime { runtime: "jvm".into(), libraries, version: java.as_deref().and_then(jdk_major), unreadable: false }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Class path jars, never a substring: a `-D` property naming
    /// `httpclient` is no library; `-cp` entries, `--class-path=`, `-jar`
    /// and a listed `dir/*` are.
    #[test]
    fn a_jvms_libraries_are_its_class_path_jars() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("HikariCP-5.0.1.jar"), b"").unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"").unwrap();
        let cmd = |args: &[&str]| args.join("\0").into_bytes();
        let jars = class_path_jars(&cmd(&[
            "java",
            "-Djdk.httpclient.keepalive.timeout=5",
            "-cp",
            "/opt/app/okhttp-4.12.0.jar:/opt/app/classes",
            "--class-path=/x/grpc-api-1.60.jar",
            &format!("-classpath={}", "/y/httpclient-4.5.jar"),
            "-jar",
            "/opt/app/app.jar",
        ]));
        assert_eq!(jars, ["okhttp-4.12.0.jar", "grpc-api-1.60.jar", "app.jar"]);
        let listed = class_path_jars(&cmd(&["java", "-cp", &format!("{}/*", dir.path().display()), "Main"]));
        assert_eq!(listed, ["hikaricp-5.0.1.jar"]);
        assert!(class_path_jars(&cmd(&["java", "-Dhttpclient.x=1", "Main"])).is_empty());
    }

    #[test]
    fn the_jdk_version_comes_from_its_release_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        let java = dir.path().join("bin/java");
        for (release, major) in
            [("JAVA_VERSION=\"17.0.15\"", Some(17)), ("JAVA_VERSION=\"1.8.0_392\"", Some(8)), ("X=1", None)]
        {
            std::fs::write(dir.path().join("release"), format!("IMPLEMENTOR=x\n{release}\n")).unwrap();
            assert_eq!(jdk_major(&java), major, "{release}");
        }
    }
}
