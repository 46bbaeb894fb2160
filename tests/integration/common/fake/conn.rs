//! The fake upstream's server side: accepting connections, reading request heads and bodies, running the script.

use super::*;

pub(super) async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut conns = JoinSet::new();
    loop {
        // Reap finished connections so the set does not grow over a long test.
        while conns.try_join_next().is_some() {}
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => stream,
            Err(_) => {
                // Out of descriptors or similar: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Each scripted write should leave as its own segment, at once.
        let _ = stream.set_nodelay(true);
        let index = shared.connections.fetch_add(1, Ordering::SeqCst);
        let open = shared.open.fetch_add(1, Ordering::SeqCst) + 1;
        shared.max_open.fetch_max(open, Ordering::SeqCst);
        let conn = Conn {
            stream,
            buf: BytesMut::with_capacity(8 * 1024),
            index,
            shared: Arc::clone(&shared),
        };
        let counted = Arc::clone(&shared);
        conns.spawn(async move {
            conn.serve().await;
            // The stream is closed once `serve` returns (it owned it).
            counted.open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Why reading a request stopped.
enum ReadError {
    /// The peer went away (EOF or an I/O error) part way through a request.
    Gone,
    /// The request is not HTTP/1.1 we can frame: answer with this status and close.
    Malformed(u16),
}

/// What to do with the connection after a script.
enum Flow {
    KeepAlive,
    Done,
}

struct Conn {
    stream: TcpStream,
    /// Bytes read but not yet parsed (a pipelined next request, say).
    buf: BytesMut,
    index: usize,
    shared: Arc<Shared>,
}

impl Conn {
    async fn serve(mut self) {
        loop {
            let (received, head_at, wants_close) = match self.read_request().await {
                Ok(Some(request)) => request,
                // Idle close between requests: nothing was pending.
                Ok(None) => return,
                Err(ReadError::Gone) => return,
                Err(ReadError::Malformed(status)) => {
                    let answer = Script::response(status, &[("connection", "close")], b"");
                    for step in answer.steps {
                        if let Step::Write(bytes) = step {
                            let _ = self.stream.write_all(&bytes).await;
                        }
                    }
                    self.close().await;
                    return;
                }
            };
            let mut nth = 0;
            self.shared.requests.send_modify(|requests| {
                nth = requests.len();
                requests.push(received);
            });
            let script = match self.shared.scripts.get(nth).or(self.shared.scripts.last()) {
                Some(script) => script.clone(),
                None => Script::no_response(),
            };
            let flow = self.run(&script, head_at).await;
            let shared = Arc::clone(&self.shared);
            if let Flow::KeepAlive = flow
                && !wants_close
            {
                shared.finished.send_modify(|ended| *ended += 1);
                continue;
            }
            if let Flow::KeepAlive = flow {
                self.close().await;
            }
            // A script has ended once its last packet left: the socket is dropped first,
            // which is when a socket set to linger 0 sends its RST.
            drop(self);
            shared.finished.send_modify(|ended| *ended += 1);
            return;
        }
    }

    /// Runs `script` for the request whose head arrived at `head_at`.
    async fn run(&mut self, script: &Script, head_at: Instant) -> Flow {
        for step in &script.steps {
            match step {
                Step::Write(bytes) => {
                    // A write to a peer that already left usually still succeeds (the kernel
                    // answers with an RST only afterwards), so look before writing.
                    if self.peer_gone_now() {
                        self.record_close(head_at);
                        return Flow::Done;
                    }
                    let written = match self.stream.write_all(bytes).await {
                        Ok(()) => self.stream.flush().await,
                        Err(e) => Err(e),
                    };
                    if written.is_err() {
                        self.record_close(head_at);
                        return Flow::Done;
                    }
                }
                Step::Pause(duration) => {
                    if !self.pause_watching(*duration).await {
                        self.record_close(head_at);
                        return Flow::Done;
                    }
                }
                Step::Reset => {
                    // SO_LINGER 0 makes the drop that follows (Flow::Done) send an RST.
                    let _ = self.stream.set_zero_linger();
                    return Flow::Done;
                }
                Step::Close => {
                    self.close().await;
                    return Flow::Done;
                }
                Step::Stall => {
                    self.wait_peer_gone().await;
                    self.record_close(head_at);
                    return Flow::Done;
                }
                Step::Hold => {
                    if !self.hold_watching().await {
                        self.record_close(head_at);
                        return Flow::Done;
                    }
                }
                // Acted on when the request head arrived (`read_request`).
                Step::Early => {}
            }
        }
        Flow::KeepAlive
    }

    /// Pauses for `duration` (the script's delay) while reading (and keeping) whatever the
    /// peer sends. Returns false as soon as the peer has gone away.
    async fn pause_watching(&mut self, duration: Duration) -> bool {
        let deadline = tokio::time::sleep(duration);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                () = &mut deadline => return true,
                read = self.stream.read_buf(&mut self.buf) => match read {
                    Ok(0) | Err(_) => return false,
                    Ok(_) => {}
                },
            }
        }
    }

    /// Waits for a [`FakeUpstream::release`] while reading (and keeping) whatever the
    /// peer sends. Returns false as soon as the peer has gone away.
    async fn hold_watching(&mut self) -> bool {
        loop {
            tokio::select! {
                permit = self.shared.released.acquire() => {
                    // The semaphore is never closed.
                    if let Ok(permit) = permit {
                        permit.forget();
                    }
                    return true;
                }
                read = self.stream.read_buf(&mut self.buf) => match read {
                    Ok(0) | Err(_) => return false,
                    Ok(_) => {}
                },
            }
        }
    }

    /// Whether the peer has already closed or reset, without waiting. Bytes it sent
    /// meanwhile are kept for the next request.
    fn peer_gone_now(&mut self) -> bool {
        loop {
            match self.stream.try_read_buf(&mut self.buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(_) => return true,
            }
        }
    }

    /// Reads and discards until EOF or an error.
    async fn wait_peer_gone(&mut self) {
        loop {
            self.buf.clear();
            match self.stream.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    /// Orderly close: FIN, then drop what already arrived unread so that dropping the socket
    /// does not turn the close into an RST.
    async fn close(&mut self) {
        let _ = self.stream.shutdown().await;
        let mut sink = [0u8; 4096];
        while matches!(self.stream.try_read(&mut sink), Ok(n) if n > 0) {}
    }

    fn record_close(&self, head_at: Instant) {
        let after = head_at.elapsed();
        self.shared.closes.send_modify(|closes| closes.push(after));
    }

    /// Reads more bytes into the buffer; false on EOF or error.
    async fn fill(&mut self) -> bool {
        matches!(self.stream.read_buf(&mut self.buf).await, Ok(n) if n > 0)
    }

    /// Reads one request. `Ok(None)` when the peer closed cleanly before sending a byte of it.
    /// Returns the request, when its head arrived, and whether the connection should close
    /// after the response.
    async fn read_request(&mut self) -> Result<Option<(Received, Instant, bool)>, ReadError> {
        let head_len = loop {
            // A server should ignore empty lines before a request line (RFC 9112, 2.2).
            while self.buf.starts_with(b"\r\n") {
                self.buf.advance(2);
            }
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                break end + 4;
            }
            if self.buf.len() > MAX_HEAD_BYTES {
                return Err(ReadError::Malformed(431));
            }
            if !self.fill().await {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(ReadError::Gone)
                };
            }
        };
        let head_at = Instant::now();
        let raw_head = self.buf.split_to(head_len).to_vec();
        let head = parse_head(&raw_head, self.index).ok_or(ReadError::Malformed(400))?;
        if self.next_script_is_early() {
            // The body is left unread, so nothing after it can be read as a request: the
            // connection closes after the script.
            return Ok(Some((Received { raw_head, ..head }, head_at, true)));
        }
        let body = match body_framing(&head)? {
            Framing::None => Ok(Vec::new()),
            Framing::Length(len) => self.read_exact(len).await,
            Framing::Chunked => self.read_chunked().await,
        };
        let body = match body {
            Ok(body) => body,
            Err(e) => {
                if matches!(e, ReadError::Gone) {
                    // The head arrived, so the response was pending when the peer left.
                    self.record_close(head_at);
                }
                return Err(e);
            }
        };
        let wants_close = wants_close(&head);
        Ok(Some((
            Received {
                body,
                raw_head,
                ..head
            },
            head_at,
            wants_close,
        )))
    }

    /// Whether the script the next recorded request gets begins with [`Step::Early`]
    /// (looked at when its head arrives; another connection's request completing first
    /// would take that script instead).
    fn next_script_is_early(&self) -> bool {
        let next = self.shared.requests.borrow().len();
        let scripts = &self.shared.scripts;
        scripts
            .get(next)
            .or(scripts.last())
            .is_some_and(|script| script.steps.first() == Some(&Step::Early))
    }

    async fn read_exact(&mut self, len: usize) -> Result<Vec<u8>, ReadError> {
        while self.buf.len() < len {
            if !self.fill().await {
                return Err(ReadError::Gone);
            }
        }
        Ok(self.buf.split_to(len).to_vec())
    }

    async fn read_line(&mut self) -> Result<Vec<u8>, ReadError> {
        loop {
            if let Some(end) = find(&self.buf, b"\r\n") {
                let line = self.buf.split_to(end).to_vec();
                self.buf.advance(2);
                return Ok(line);
            }
            if self.buf.len() > MAX_HEAD_BYTES {
                return Err(ReadError::Malformed(400));
            }
            if !self.fill().await {
                return Err(ReadError::Gone);
            }
        }
    }

    async fn read_chunked(&mut self) -> Result<Vec<u8>, ReadError> {
        let mut body = Vec::new();
        loop {
            let line = self.read_line().await?;
            let size = parse_chunk_size(&line).ok_or(ReadError::Malformed(400))?;
            if size == 0 {
                // Trailer fields, up to the empty line, are read and dropped.
                while !self.read_line().await?.is_empty() {}
                return Ok(body);
            }
            body.extend_from_slice(&self.read_exact(size).await?);
            if !self.read_line().await?.is_empty() {
                return Err(ReadError::Malformed(400));
            }
        }
    }
}

/// How a request body is delimited.
enum Framing {
    None,
    Length(usize),
    Chunked,
}

/// Chooses the body framing as RFC 9112 section 6.3 says: chunked transfer coding wins over
/// `Content-Length`; any other transfer coding, or disagreeing lengths, is a 400.
fn body_framing(head: &Received) -> Result<Framing, ReadError> {
    let codings = head.header_all("transfer-encoding");
    if !codings.is_empty() {
        let last = codings
            .iter()
            .flat_map(|value| value.split(','))
            .map(str::trim)
            .rfind(|coding| !coding.is_empty());
        return match last {
            Some(coding) if coding.eq_ignore_ascii_case("chunked") => Ok(Framing::Chunked),
            _ => Err(ReadError::Malformed(400)),
        };
    }
    let mut length = None;
    for value in head
        .header_all("content-length")
        .iter()
        .flat_map(|v| v.split(','))
    {
        let value = value.trim();
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ReadError::Malformed(400));
        }
        let parsed: usize = value.parse().map_err(|_| ReadError::Malformed(400))?;
        if length.is_some_and(|known| known != parsed) {
            return Err(ReadError::Malformed(400));
        }
        length = Some(parsed);
    }
    Ok(match length {
        None | Some(0) => Framing::None,
        Some(len) => Framing::Length(len),
    })
}

/// Whether the connection ends after this request: `Connection: close`, or HTTP/1.0
/// without `Connection: keep-alive`.
fn wants_close(head: &Received) -> bool {
    let has_token = |token: &str| {
        head.header_all("connection")
            .iter()
            .flat_map(|value| value.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    has_token("close") || (head.version == "HTTP/1.0" && !has_token("keep-alive"))
}

/// Parses a request head (request line through the empty line) into a [`Received`] with an
/// empty body and `raw_head`. `None` when it is not an HTTP/1.x request head.
fn parse_head(raw: &[u8], connection: usize) -> Option<Received> {
    let mut lines = raw
        .split(|b| *b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let request_line = std::str::from_utf8(lines.next()?).ok()?;
    let mut parts = request_line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || method.is_empty()
        || target.is_empty()
        || !version.starts_with("HTTP/1.")
    {
        return None;
    }
    let mut headers = Vec::new();
    for line in lines.take_while(|l| !l.is_empty()) {
        let colon = line.iter().position(|b| *b == b':')?;
        let (name, value) = (line.get(..colon)?, line.get(colon + 1..)?);
        // Whitespace in or before a name (including obsolete line folding) is rejected.
        if name.is_empty() || name.iter().any(|b| b.is_ascii_whitespace()) {
            return None;
        }
        let name = std::str::from_utf8(name).ok()?.to_ascii_lowercase();
        let value = String::from_utf8_lossy(value)
            .trim_matches([' ', '\t'])
            .to_owned();
        headers.push((name, value));
    }
    Some(Received {
        method: method.to_owned(),
        target: target.to_owned(),
        version: version.to_owned(),
        headers,
        body: Vec::new(),
        raw_head: Vec::new(),
        connection,
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
