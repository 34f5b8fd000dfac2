//! A real OCI registry for tests: Debian's docker-registry (the CNCF distribution server)
//! on a free 127.0.0.1 port, with TLS from a CA made here (openssl) and htpasswd (bcrypt,
//! apache2-utils' htpasswd) auth, its storage in a temporary directory. Killed when
//! dropped.
//!
//! docker-registry, openssl and htpasswd are required: a missing one panics (fails the
//! test), naming the package. [`skip_registry_tests`] is the one opt-out.

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The user and password the registry accepts.
pub const REGISTRY_USER: &str = "pusher";
pub const REGISTRY_PASSWORD: &str = "correct horse";

/// Whether COMMSTACK_SKIP_REGISTRY_TESTS=1 asks to skip the tests that need a registry
/// (says so on stderr). Without it, a missing tool fails the test.
pub fn skip_registry_tests() -> bool {
    let skip = std::env::var("COMMSTACK_SKIP_REGISTRY_TESTS").is_ok_and(|v| v == "1");
    if skip {
        eprintln!("COMMSTACK_SKIP_REGISTRY_TESTS=1: registry tests skipped");
    }
    skip
}

/// Runs `program` in `dir`; panics naming the Debian packages when it is missing, and
/// with its stderr when it fails.
pub fn run_tool(dir: &Path, program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("{program} is needed for this test ({e}); Debian: docker-registry, apache2-utils, openssl, skopeo (or COMMSTACK_SKIP_REGISTRY_TESTS=1)")
        });
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A new ed25519 private key made by openssl in `dir`: `<name>.pem` (PKCS#8, what commstack
/// signs with). [`ed25519_key_pair`] when the test needs its public half as a file too.
pub fn ed25519_key(dir: &Path, name: &str) -> PathBuf {
    let key = format!("{name}.pem");
    run_tool(
        dir,
        "openssl",
        &["genpkey", "-algorithm", "ed25519", "-out", &key],
    );
    dir.join(key)
}

/// A new ed25519 key pair made by openssl in `dir`: `<name>.pem` (PKCS#8, what commstack
/// signs with) and `<name>.pub` (the SubjectPublicKeyInfo PEM cosign verifies with).
pub fn ed25519_key_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let (key, public) = (format!("{name}.pem"), format!("{name}.pub"));
    let private = ed25519_key(dir, name);
    run_tool(
        dir,
        "openssl",
        &["pkey", "-in", &key, "-pubout", "-out", &public],
    );
    (private, dir.join(public))
}

/// How the registry asks for credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegistryAuthMode {
    /// HTTP basic against an htpasswd file.
    Htpasswd,
    /// Bearer tokens: the registry sends clients to a token service (a small one here,
    /// [`TokenService`]) that checks the user and password and signs a JWT with a key
    /// whose certificate the registry trusts.
    Token,
}

/// A docker-registry on loopback.
pub struct TestRegistry {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
    token: Option<TokenService>,
}

impl TestRegistry {
    /// Prepared and serving, with htpasswd auth.
    pub fn start() -> TestRegistry {
        TestRegistry::start_with(RegistryAuthMode::Htpasswd)
    }

    /// Prepared and serving, with `auth`.
    pub fn start_with(auth: RegistryAuthMode) -> TestRegistry {
        let mut registry = TestRegistry::prepare_with(auth);
        registry.serve();
        registry
    }

    /// Certificates, htpasswd and config on a free port; not serving yet (a test of a
    /// registry that comes up late calls [`TestRegistry::serve`] itself).
    pub fn prepare() -> TestRegistry {
        TestRegistry::prepare_with(RegistryAuthMode::Htpasswd)
    }

    /// [`TestRegistry::prepare`] with `auth`.
    pub fn prepare_with(auth: RegistryAuthMode) -> TestRegistry {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let path = |name: &str| d.join(name).to_str().unwrap().to_string();
        std::fs::write(
            d.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n",
        )
        .unwrap();
        // A CA, and a server certificate it signs for 127.0.0.1 (EC keys: fast to make).
        let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        for command in [
            format!(
                "req -x509 {ec} -keyout ca.key -out ca.crt -days 2 -subj /CN=commstack-test-CA -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
            ),
            format!("req {ec} -keyout server.key -out server.csr -subj /CN=127.0.0.1"),
            "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile server.ext".to_string(),
        ] {
            let args: Vec<&str> = command.split(' ').collect();
            run_tool(d, "openssl", &args);
        }
        // skopeo's --cert-dir reads *.crt as CAs.
        std::fs::create_dir(d.join("certs")).unwrap();
        std::fs::copy(d.join("ca.crt"), d.join("certs/ca.crt")).unwrap();
        let htpasswd = run_tool(d, "htpasswd", &["-Bbn", REGISTRY_USER, REGISTRY_PASSWORD]);
        std::fs::write(d.join("htpasswd"), &htpasswd.stdout).unwrap();

        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let (auth_config, token) = match auth {
            RegistryAuthMode::Htpasswd => (
                format!(
                    "  htpasswd:\n    realm: commstack-test\n    path: {}\n",
                    path("htpasswd")
                ),
                None,
            ),
            RegistryAuthMode::Token => {
                let token = TokenService::start(d);
                (
                    format!(
                        "  token:\n    realm: {}\n    service: {TOKEN_SERVICE}\n    issuer: {TOKEN_ISSUER}\n    rootcertbundle: {}\n",
                        token.realm(),
                        path("token.crt")
                    ),
                    Some(token),
                )
            }
        };
        std::fs::write(
            d.join("config.yml"),
            format!(
                "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {storage}\nhttp:\n  addr: 127.0.0.1:{port}\n  tls:\n    certificate: {crt}\n    key: {key}\nauth:\n{auth_config}",
                storage = path("storage"),
                crt = path("server.crt"),
                key = path("server.key"),
            ),
        )
        .unwrap();
        TestRegistry {
            dir,
            port,
            child: None,
            token,
        }
    }

    /// Starts docker-registry; returns when it listens.
    pub fn serve(&mut self) {
        let d = self.dir.path();
        let log = std::fs::File::create(d.join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(d.join("config.yml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("docker-registry is needed for this test ({e}): apt-get install docker-registry (or COMMSTACK_SKIP_REGISTRY_TESTS=1)")
            });
        let child = self.child.insert(child);
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("docker-registry exited ({status}): {}", self.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "docker-registry did not listen on {}: {}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills docker-registry (a registry gone midway); [`TestRegistry::serve`] starts it
    /// again on the same port, with the same storage.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The file that holds the blob `digest` (`sha256:<hex>`) in the registry's
    /// filesystem storage (distribution's layout), to damage or remove it.
    pub fn blob_data(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// What the registry wrote to stdout and stderr.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The CA certificate (PEM) the server's certificate chains to.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The registry's login ([`REGISTRY_USER`], [`REGISTRY_PASSWORD`]) as an `auths` file
    /// at `path`: containers-auth.json(5) for skopeo (`REGISTRY_AUTH_FILE`) and a Docker
    /// config.json (`DOCKER_CONFIG`) alike.
    pub fn write_auths(&self, path: &Path) {
        let auth = base64::engine::general_purpose::STANDARD
            .encode(format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}"));
        std::fs::write(
            path,
            format!(
                "{{\"auths\":{{\"{}\":{{\"auth\":\"{auth}\"}}}}}}",
                self.host()
            ),
        )
        .unwrap();
    }

    /// The token service's requests so far, for a token-auth registry: (user, scope,
    /// granted).
    pub fn token_requests(&self) -> Vec<(String, String, bool)> {
        self.token
            .as_ref()
            .map(|t| t.requests.lock().unwrap().clone())
            .unwrap_or_default()
    }

    /// The next token the token service grants has expired already: what a client holds
    /// when a long pull outlives its token.
    pub fn expire_next_token(&self) {
        if let Some(t) = &self.token {
            t.expire_next.store(true, Ordering::SeqCst);
        }
    }

    /// A directory holding only the CA as `ca.crt` (skopeo's `--cert-dir`).
    pub fn cert_dir(&self) -> PathBuf {
        self.dir.path().join("certs")
    }

    /// The registry's blob files (distribution's filesystem layout): digest hex, inode,
    /// mtime (s, ns), sorted. Equal before and after an operation: no blob was written.
    pub fn blob_files(&self) -> Vec<(String, u64, i64, i64)> {
        let root = self
            .dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256");
        let mut files = Vec::new();
        for prefix in std::fs::read_dir(&root).into_iter().flatten() {
            for blob in std::fs::read_dir(prefix.unwrap().path()).unwrap() {
                let blob = blob.unwrap();
                let meta = std::fs::metadata(blob.path().join("data")).unwrap();
                files.push((
                    blob.file_name().to_string_lossy().into_owned(),
                    meta.ino(),
                    meta.mtime(),
                    meta.mtime_nsec(),
                ));
            }
        }
        files.sort();
        files
    }
}

const TOKEN_SERVICE: &str = "commstack-test";
const TOKEN_ISSUER: &str = "commstack-test-issuer";

/// A token service as the distribution spec's token auth has it: `GET /token?service=..
/// &scope=repository:NAME:ACTIONS` with HTTP basic credentials answers
/// `{"token": JWT}`, the JWT signed RS256 (openssl) with a key whose self-signed
/// certificate is the registry's `rootcertbundle` and named in the JWT's `x5c`. Wrong
/// credentials get 401. Plain HTTP on 127.0.0.1.
struct TokenService {
    port: u16,
    stop: Arc<AtomicBool>,
    requests: Arc<Mutex<Vec<(String, String, bool)>>>,
    /// The next token granted has expired already (a long pull outliving its token).
    expire_next: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TokenService {
    /// Makes `dir/token.key` and `dir/token.crt`, and serves.
    fn start(dir: &Path) -> TokenService {
        run_tool(
            dir,
            "openssl",
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "token.key",
                "-out",
                "token.crt",
                "-days",
                "2",
                "-subj",
                "/CN=commstack-test-token",
            ],
        );
        let der = run_tool(
            dir,
            "openssl",
            &["x509", "-in", "token.crt", "-outform", "DER"],
        )
        .stdout;
        let x5c = base64::engine::general_purpose::STANDARD.encode(der);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let expire_next = Arc::new(AtomicBool::new(false));
        let (stop2, requests2, expire2, dir) = (
            stop.clone(),
            requests.clone(),
            expire_next.clone(),
            dir.to_path_buf(),
        );
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let _ = answer(stream, &dir, &x5c, &requests2, &expire2);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        TokenService {
            port,
            stop,
            requests,
            expire_next,
            thread: Some(thread),
        }
    }

    fn realm(&self) -> String {
        format!("http://127.0.0.1:{}/token", self.port)
    }
}

impl Drop for TokenService {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One request of the token service (one per connection: `Connection: close`).
fn answer(
    stream: std::net::TcpStream,
    dir: &Path,
    x5c: &str,
    requests: &Mutex<Vec<(String, String, bool)>>,
    expire_next: &AtomicBool,
) -> std::io::Result<()> {
    use std::io::{BufRead, BufReader, Write};
    stream.set_nonblocking(false)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let target = line.split(' ').nth(1).unwrap_or_default().to_string();
    let mut authorization = String::new();
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("authorization")
        {
            authorization = value.trim().to_string();
        }
    }
    let query = target.split_once('?').map(|(_, q)| q).unwrap_or_default();
    let scopes: Vec<String> = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == "scope")
        .map(|(_, v)| percent_decode(v))
        .collect();
    let user = authorization
        .strip_prefix("Basic ")
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default();
    let granted = user == format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}");
    let name = user.split(':').next().unwrap_or_default().to_string();
    requests
        .lock()
        .unwrap()
        .push((name.clone(), scopes.join(" "), granted));
    let mut stream = stream;
    if !granted {
        let body = r#"{"errors":[{"code":"UNAUTHORIZED","message":"wrong user or password"}]}"#;
        return write!(
            stream,
            "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
    let access: Vec<serde_json::Value> = scopes
        .iter()
        .filter_map(|scope| {
            let mut parts = scope.splitn(3, ':');
            let (kind, name, actions) = (parts.next()?, parts.next()?, parts.next()?);
            Some(serde_json::json!({
                "type": kind, "name": name, "actions": actions.split(',').collect::<Vec<_>>(),
            }))
        })
        .collect();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // Expired beyond the registry's leeway (60 s), as a token does that a long pull
    // outlived: issued two hours ago, for an hour.
    let (now, lifetime) = match expire_next.swap(false, Ordering::SeqCst) {
        true => (now - 7200, 3600),
        false => (now, 600),
    };
    let url = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let header = serde_json::json!({"typ": "JWT", "alg": "RS256", "x5c": [x5c]});
    let claims = serde_json::json!({
        "iss": TOKEN_ISSUER, "sub": name, "aud": TOKEN_SERVICE,
        "exp": now + lifetime, "nbf": now - 60, "iat": now, "jti": format!("{now}-{}", access.len()),
        "access": access,
    });
    let signing_input = format!(
        "{}.{}",
        url(header.to_string().as_bytes()),
        url(claims.to_string().as_bytes())
    );
    let input = tempfile::NamedTempFile::new_in(dir)?;
    std::fs::write(input.path(), &signing_input)?;
    let signature = run_tool(
        dir,
        "openssl",
        &[
            "dgst",
            "-sha256",
            "-sign",
            "token.key",
            "-binary",
            input.path().to_str().unwrap(),
        ],
    )
    .stdout;
    let token = format!("{signing_input}.{}", url(&signature));
    let body = serde_json::json!({"token": token, "access_token": token, "expires_in": lifetime})
        .to_string();
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A query value with its `%XX` escapes and `+` decoded.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => out.push(b),
                    Err(_) => out.extend_from_slice(&bytes[i..i + 3]),
                }
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
