//! The loopback HTTP server: routes, misbehaviours, request log.

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::http::{self, RangeAnswer};

/// How a route's answer misbehaves (or not).
#[derive(Clone, Debug, Default)]
pub enum Behavior {
    /// Serve the body; honour `Range`.
    #[default]
    Normal,
    /// Announce the full `Content-Length`, send only the first `after` bytes of the body
    /// (of the 206 part when a range was asked), then close the connection (FIN).
    Truncate { after: usize },
    /// Send half the body, then reset the connection (RST), as a crashed peer would.
    DropMidway,
    /// Same length, one byte flipped (the middle one of what is sent).
    WrongBytes,
    /// Send `chunk` bytes, flush, sleep `delay`, repeat.
    Slow { chunk: usize, delay: Duration },
    /// A body of `len` bytes, the route's body repeated, made while it is sent (never held
    /// in memory, so a test can serve gigabytes); with `announce: false` it has no
    /// `Content-Length` and ends when the connection closes. `Range` is ignored.
    Huge { len: u64, announce: bool },
    /// Always answer 200 with the full body, whatever `Range` asks.
    IgnoreRange,
    /// Answer `status` (301/302/307/308) with `Location: to` (a path or a full URL).
    Redirect { to: String, status: u16 },
    /// The first `n` requests of this path get `status` (with `Retry-After: secs` when
    /// given), later ones the normal answer.
    FailFirst {
        n: usize,
        status: u16,
        retry_after: Option<u64>,
    },
}

/// What a path answers.
#[derive(Clone, Debug)]
pub struct Route {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub behavior: Behavior,
    /// Answer 200 with the full body whatever `Range` asks (combines with any behavior,
    /// e.g. a server that ignores Range *and* drops connections).
    pub ignore_range: bool,
}

impl Route {
    /// 200 with `body` (`Content-Type: application/octet-stream` unless set otherwise).
    pub fn ok(body: impl Into<Vec<u8>>) -> Route {
        Route {
            status: 200,
            headers: Vec::new(),
            body: body.into(),
            behavior: Behavior::Normal,
            ignore_range: false,
        }
    }

    /// `status` with a short text body (e.g. 404, 500, 403).
    pub fn status(status: u16) -> Route {
        let body = format!("{status} {}\n", http::reason(status)).into_bytes();
        Route {
            status,
            headers: Vec::new(),
            body,
            behavior: Behavior::Normal,
            ignore_range: false,
        }
        .header("Content-Type", "text/plain")
    }

    /// 302 to `to` (a path on this server or a full URL).
    pub fn redirect(to: impl Into<String>) -> Route {
        Route::ok(Vec::new()).behavior(Behavior::Redirect {
            to: to.into(),
            status: 302,
        })
    }

    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Route {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn behavior(mut self, behavior: Behavior) -> Route {
        self.behavior = behavior;
        self
    }

    /// See [`Route::ignore_range`].
    pub fn ignore_range(mut self) -> Route {
        self.ignore_range = true;
        self
    }
}

/// One request as the server received it.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    /// The path without the query string.
    pub path: String,
    pub query: Option<String>,
    /// The raw `Range` header, e.g. `bytes=1000-`.
    pub range: Option<String>,
    pub headers: Vec<(String, String)>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The answers of one path: the n-th request gets `answers[n]`, the last one repeats.
struct RouteState {
    answers: Vec<Route>,
    served: usize,
}

#[derive(Default)]
struct Shared {
    routes: Mutex<HashMap<String, RouteState>>,
    log: Mutex<Vec<Request>>,
    connections: AtomicUsize,
    stopping: AtomicBool,
    /// Clones of the open connections (by connection number), shut down when the server
    /// is dropped.
    open: Mutex<HashMap<usize, TcpStream>>,
    /// Bytes written, heads included, by path (what reached the socket, not what a client
    /// read).
    sent: Mutex<HashMap<String, u64>>,
}

/// A real HTTP/1.1 server on 127.0.0.1; stops accepting and closes its connections on drop.
pub struct TestServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Binds 127.0.0.1 on a free port and starts serving.
    pub fn start() -> TestServer {
        let listener =
            TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0 for the test server");
        let addr = listener
            .local_addr()
            .expect("local address of the test server");
        let shared = Arc::new(Shared::default());
        let accept_shared = shared.clone();
        let accept_thread = thread::Builder::new()
            .name(format!("testkit-http-{}", addr.port()))
            .spawn(move || accept_loop(listener, accept_shared))
            .expect("spawn the test server thread");
        TestServer {
            addr,
            shared,
            accept_thread: Some(accept_thread),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:PORT` + `path` (`path` should start with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url())
    }

    /// Every request of `path` gets `route` (replaces what `path` answered before and
    /// resets its answer counter, not its hit count).
    pub fn route(&self, path: &str, route: Route) {
        self.route_seq(path, vec![route]);
    }

    /// The n-th request of `path` gets `answers[n]`; the last answer repeats. E.g.
    /// `[truncated, normal]` for "fails once, then the resume works".
    pub fn route_seq(&self, path: &str, answers: Vec<Route>) {
        assert!(
            !answers.is_empty(),
            "route_seq needs at least one answer for {path}"
        );
        self.shared
            .routes
            .lock()
            .unwrap()
            .insert(path.to_string(), RouteState { answers, served: 0 });
    }

    /// How many requests (any method) reached `path`.
    pub fn hits(&self, path: &str) -> usize {
        self.shared
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .count()
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.log.lock().unwrap().clone()
    }

    /// The requests of one path, in arrival order.
    pub fn requests_for(&self, path: &str) -> Vec<Request> {
        self.shared
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }

    /// Bytes the server wrote for `path`, over every request (each answer's head
    /// included: a few hundred bytes): with [`Behavior::Huge`] it shows where a client
    /// stopped reading (plus what the socket buffers took).
    pub fn body_bytes_sent(&self, path: &str) -> u64 {
        self.shared
            .sent
            .lock()
            .unwrap()
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    /// How many TCP connections were accepted (0 proves a client never connected).
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the blocking accept() so the thread sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(thread) = self.accept_thread.take() {
            let _ = thread.join();
        }
        for (_, stream) in self.shared.open.lock().unwrap().drain() {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = stream else { continue };
        let id = shared.connections.fetch_add(1, Ordering::SeqCst);
        if let Ok(clone) = stream.try_clone() {
            shared.open.lock().unwrap().insert(id, clone);
        }
        let shared = shared.clone();
        let _ = thread::Builder::new()
            .name("testkit-conn".into())
            .spawn(move || {
                // Errors here are the client's doing (it hung up); nothing to report.
                let ending = serve_connection(stream, &shared);
                // Dropping the last clone closes the socket (with RST when DropMidway set it).
                shared.open.lock().unwrap().remove(&id);
                drop(ending);
            });
    }
}

/// Serves requests on one connection until the client closes it or an answer ends it.
/// Returns the stream so the caller decides when the socket's last descriptor closes.
fn serve_connection(stream: TcpStream, shared: &Shared) -> std::io::Result<TcpStream> {
    // A client that holds an idle connection must not pin this thread forever.
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    while let Some(head) = http::read_head(&mut reader)? {
        if let Some(len) = head
            .header("Content-Length")
            .and_then(|v| v.parse::<u64>().ok())
        {
            std::io::copy(&mut (&mut reader).take(len), &mut std::io::sink())?;
        }
        let (path, query) = match head.target.split_once('?') {
            Some((path, query)) => (path.to_string(), Some(query.to_string())),
            None => (head.target.clone(), None),
        };
        let request = Request {
            method: head.method.clone(),
            path: path.clone(),
            query,
            range: head.header("Range").map(str::to_string),
            headers: head.headers.clone(),
        };
        let hit_index = {
            let mut log = shared.log.lock().unwrap();
            let index = log.iter().filter(|r| r.path == path).count();
            log.push(request.clone());
            index
        };
        let route = next_answer(shared, &path);
        let mut out = Counted {
            stream: &mut writer,
            sent: 0,
        };
        let after = respond(&mut out, &request, route, hit_index);
        *shared.sent.lock().unwrap().entry(path).or_default() += out.sent;
        let after = after?;
        let client_closes = head
            .header("Connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        match after {
            After::KeepOpen if !client_closes => {}
            After::KeepOpen | After::Close => {
                let _ = writer.shutdown(Shutdown::Both);
                return Ok(writer);
            }
            // No shutdown(): that would send FIN; the RST goes out when the last
            // descriptor closes.
            After::Reset => return Ok(writer),
        }
    }
    Ok(writer)
}

/// The connection's writer, counting the bytes written (head included; the head is a few
/// hundred bytes, so what a test compares, a body's megabytes, is not blurred by it).
struct Counted<'a> {
    stream: &'a mut TcpStream,
    sent: u64,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.stream.write(buf)?;
        self.sent += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

/// What happens to the connection after an answer.
enum After {
    KeepOpen,
    /// Close with FIN (the client sees an early end of the body).
    Close,
    /// Close with RST (SO_LINGER 0 already set).
    Reset,
}

fn next_answer(shared: &Shared, path: &str) -> Option<Route> {
    let mut routes = shared.routes.lock().unwrap();
    let state = routes.get_mut(path)?;
    let index = state.served.min(state.answers.len() - 1);
    state.served += 1;
    Some(state.answers[index].clone())
}

/// Writes one answer; says what becomes of the connection.
fn respond(
    out: &mut Counted<'_>,
    request: &Request,
    route: Option<Route>,
    hit_index: usize,
) -> std::io::Result<After> {
    let head_only = request.method.eq_ignore_ascii_case("HEAD");
    let Some(route) = route else {
        write_simple(out, 404, &[], b"404 Not Found\n", head_only)?;
        return Ok(After::KeepOpen);
    };
    match &route.behavior {
        Behavior::Redirect { to, status } => {
            write_simple(
                out,
                *status,
                &[("Location".into(), to.clone())],
                b"",
                head_only,
            )?;
            return Ok(After::KeepOpen);
        }
        Behavior::FailFirst {
            n,
            status,
            retry_after,
        } if hit_index < *n => {
            let mut headers = vec![("Content-Type".to_string(), "text/plain".to_string())];
            if let Some(secs) = retry_after {
                headers.push(("Retry-After".into(), secs.to_string()));
            }
            let body = format!("{status} {}\n", http::reason(*status));
            write_simple(out, *status, &headers, body.as_bytes(), head_only)?;
            return Ok(After::KeepOpen);
        }
        _ => {}
    }

    let full = &route.body;
    let mut status = route.status;
    let mut headers = route.headers.clone();
    let mut part: &[u8] = full;
    if let Behavior::Huge { len, announce } = route.behavior {
        return write_huge(out, status, &headers, full, len, announce, head_only);
    }
    let honour_range =
        status == 200 && !route.ignore_range && !matches!(route.behavior, Behavior::IgnoreRange);
    if let (true, Some(range)) = (honour_range, &request.range) {
        match http::parse_range(range, full.len()) {
            RangeAnswer::Partial { start, end } => {
                status = 206;
                headers.push((
                    "Content-Range".into(),
                    format!("bytes {start}-{}/{}", end - 1, full.len()),
                ));
                part = &full[start..end];
            }
            RangeAnswer::Unsatisfiable => {
                let headers = [(
                    "Content-Range".to_string(),
                    format!("bytes */{}", full.len()),
                )];
                write_simple(out, 416, &headers, b"", head_only)?;
                return Ok(After::KeepOpen);
            }
            RangeAnswer::Ignore => {}
        }
    }
    if status == 200 || status == 206 {
        headers.push(("Accept-Ranges".into(), "bytes".into()));
    }
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("Content-Type"))
    {
        headers.push(("Content-Type".into(), "application/octet-stream".into()));
    }
    write_head(out, status, &headers, part.len())?;
    if head_only {
        out.flush()?;
        return Ok(After::KeepOpen);
    }

    match &route.behavior {
        Behavior::Truncate { after } => {
            out.write_all(&part[..(*after).min(part.len())])?;
            out.flush()?;
            Ok(After::Close)
        }
        Behavior::DropMidway => {
            out.write_all(&part[..part.len() / 2])?;
            out.flush()?;
            reset_on_close(out.stream);
            Ok(After::Reset)
        }
        Behavior::WrongBytes => {
            let mut wrong = part.to_vec();
            if let Some(byte) = wrong.get_mut(part.len() / 2) {
                *byte ^= 0xff;
            }
            out.write_all(&wrong)?;
            out.flush()?;
            Ok(After::KeepOpen)
        }
        Behavior::Slow { chunk, delay } => {
            for piece in part.chunks((*chunk).max(1)) {
                out.write_all(piece)?;
                out.flush()?;
                thread::sleep(*delay);
            }
            Ok(After::KeepOpen)
        }
        _ => {
            out.write_all(part)?;
            out.flush()?;
            Ok(After::KeepOpen)
        }
    }
}

fn write_head(
    out: &mut impl Write,
    status: u16,
    headers: &[(String, String)],
    len: usize,
) -> std::io::Result<()> {
    write_head_with(out, status, headers, Some(len as u64))
}

/// The status line and headers; `Content-Length` when `len` is given.
fn write_head_with(
    out: &mut impl Write,
    status: u16,
    headers: &[(String, String)],
    len: Option<u64>,
) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", http::reason(status));
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    match len {
        Some(len) => head.push_str(&format!("Content-Length: {len}\r\n\r\n")),
        None => head.push_str("Connection: close\r\n\r\n"),
    }
    out.write_all(head.as_bytes())
}

/// [`Behavior::Huge`]: `len` bytes of `pattern` repeated, written as they are made.
fn write_huge(
    out: &mut Counted<'_>,
    status: u16,
    headers: &[(String, String)],
    pattern: &[u8],
    len: u64,
    announce: bool,
    head_only: bool,
) -> std::io::Result<After> {
    let mut headers = headers.to_vec();
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("Content-Type"))
    {
        headers.push(("Content-Type".into(), "application/octet-stream".into()));
    }
    write_head_with(out, status, &headers, announce.then_some(len))?;
    if head_only {
        out.flush()?;
        return Ok(if announce {
            After::KeepOpen
        } else {
            After::Close
        });
    }
    let pattern = if pattern.is_empty() {
        &[0u8][..]
    } else {
        pattern
    };
    // About 64 KiB of the pattern per write.
    let block: Vec<u8> = pattern
        .iter()
        .copied()
        .cycle()
        .take(pattern.len() * (65536 / pattern.len()).max(1))
        .collect();
    let mut left = len;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        // A client that stops reading closes the connection: the write fails and ends this.
        out.write_all(&block[..n])?;
        left -= n as u64;
    }
    out.flush()?;
    // Without Content-Length the end of the body is the end of the connection.
    Ok(if announce {
        After::KeepOpen
    } else {
        After::Close
    })
}

fn write_simple(
    out: &mut impl Write,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
    head_only: bool,
) -> std::io::Result<()> {
    write_head(out, status, headers, body.len())?;
    if !head_only {
        out.write_all(body)?;
    }
    out.flush()
}

/// SO_LINGER with a zero timeout: close() then sends RST instead of FIN.
fn reset_on_close(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket fd and a correctly sized, initialised linger struct.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}
