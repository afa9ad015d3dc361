//! Section c's event loops: one thread a side, every connection's
//! request-response in one loop, over X-IO ([`Net::poll`]) and over
//! kernel sockets (epoll).

use super::*;

/// Section c's client over X-IO: the same protocol as [`epoll_client`]
/// (one request in flight per connection, replies checked), with
/// [`Net::poll`] as the event loop.
pub(super) fn xio_loop_client(
    net: &Net,
    mut connect: impl FnMut() -> io::Result<XioStream>,
    child: Option<&mut ServerChild>,
    job: &Job,
    batch_writes: bool,
) -> Result<Outcome> {
    let n = job.conns;
    let first = retry_connect(&mut connect, child, READY_TIMEOUT)?;
    let mut conns = vec![first];
    for _ in 1..n {
        conns.push(connect().context("connecting")?);
    }
    // Tokens are indices, as the epoll loops' are.
    for (i, c) in conns.iter().enumerate() {
        c.set_nonblocking(true)?;
        c.set_token(i as u64);
    }
    struct St {
        sent_at: u64,
        seq: u64,
        got: usize,
        rx: [u8; MSG],
    }
    let msg = |i: usize, seq: u64| {
        let mut m = [0u8; MSG];
        m[..8].copy_from_slice(&seq.to_le_bytes());
        m[8..16].copy_from_slice(&(i as u64).to_le_bytes());
        m
    };
    // The samples' pages are touched before any request leaves, so that
    // work eats neither the warm-up nor the measured window.
    let mut out = Outcome {
        samples: presized(sample_room(job.measure)),
        ..Outcome::default()
    };
    let clock = Clock::start();
    let mut st: Vec<St> = (0..n)
        .map(|_| St {
            sent_at: 0,
            seq: 0,
            got: 0,
            rx: [0; MSG],
        })
        .collect();
    for (i, c) in conns.iter().enumerate() {
        st[i].sent_at = clock.now();
        (&*c).write_all(&msg(i, 0)).context("first request")?;
    }
    let start = clock.now();
    let measure_from = start + clock.ticks(job.warm);
    let measure_to = measure_from + clock.ticks(job.measure);
    let drain_to = measure_to + clock.ticks(DRAIN_TIMEOUT);
    let mut events = Vec::new();
    let mut in_flight = n;
    let mut stopping = false;
    while in_flight > 0 {
        let now = clock.now();
        if !stopping && now >= measure_to {
            stopping = true;
        }
        if stopping && now >= drain_to {
            bail!("{in_flight} replies never came");
        }
        events.clear();
        net.poll(&mut events, Some(Duration::from_millis(100)))?;
        // With `batch_writes`, the pass's requests leave together when it
        // ends (the guard drops at the end of the loop body).
        let _batch = (batch_writes && events.len() > 1).then(|| net.batch_writes());
        for ev in &events {
            let xio_core::net::Event::Stream {
                token,
                readable: true,
                ..
            } = *ev
            else {
                continue;
            };
            let i = token as usize;
            if i >= conns.len() {
                continue;
            }
            let c = &conns[i];
            loop {
                let s = &mut st[i];
                match (&*c).read(&mut s.rx[s.got..]) {
                    Ok(0) => bail!("server closed connection {i}"),
                    Ok(k) => s.got += k,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e).context("reading reply"),
                }
                if s.got < MSG {
                    continue;
                }
                let t = clock.now();
                ensure!(s.rx == msg(i, s.seq), "wrong reply on connection {i}");
                if s.sent_at >= measure_from && t <= measure_to {
                    out.samples.push(t - s.sent_at);
                    out.ops += 1;
                }
                s.got = 0;
                if stopping {
                    in_flight -= 1;
                    break;
                }
                s.seq += 1;
                // The reply's time stamps the next request, as the kernel
                // sockets' client does: one clock read per request each.
                s.sent_at = t;
                (&*c).write_all(&msg(i, s.seq)).context("request")?;
            }
        }
    }
    to_ns(&mut out.samples, clock.ns_per_tick());
    out.wall = job.measure;
    Ok(out)
}

/// Room for the latency samples of a measured window of `d`: enough for
/// 12 M requests/s (every transport here stays below), at most 16 M
/// samples (128 MiB); a longer window grows the vector as it goes.
fn sample_room(d: Duration) -> usize {
    ((d.as_secs_f64() * 12e6) as usize).clamp(1 << 16, 16 << 20)
}

/// Section c's server over X-IO: accepts `n` connections, then echoes with
/// [`Net::poll`] as the event loop.
pub(super) fn xio_loop_server(
    net: &Net,
    l: &XioListener,
    n: usize,
    batch_writes: bool,
) -> Result<()> {
    // Tokens are indices into `conns`, as the epoll loops' are.
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        let (s, _) = l.accept().context("accept")?;
        s.set_nonblocking(true)?;
        s.set_token(i as u64);
        conns.push(Some((s, [0u8; MSG], 0usize)));
    }
    let mut open = n;
    let mut events = Vec::new();
    while open > 0 {
        events.clear();
        net.poll(&mut events, None)?;
        let _batch = (batch_writes && events.len() > 1).then(|| net.batch_writes());
        for ev in &events {
            let xio_core::net::Event::Stream {
                token,
                readable: true,
                ..
            } = *ev
            else {
                continue;
            };
            let mut closed = false;
            if let Some(Some((s, buf, got))) = conns.get_mut(token as usize) {
                loop {
                    match (&*s).read(&mut buf[*got..]) {
                        Ok(0) => {
                            closed = true;
                            break;
                        }
                        Ok(k) => *got += k,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                            closed = true;
                            break;
                        }
                        Err(e) => return Err(e).context("reading request"),
                    }
                    if *got == MSG {
                        (&*s).write_all(&buf[..]).context("reply")?;
                        *got = 0;
                    }
                }
            }
            if closed {
                conns[token as usize] = None;
                open -= 1;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Section c: epoll event loops over kernel sockets
// ---------------------------------------------------------------------------

fn set_nonblocking(fd: impl AsFd) -> Result<()> {
    rustix::io::ioctl_fionbio(fd, true).context("setting O_NONBLOCK")
}

/// `epoll_wait` into `events` (cleared first); `EINTR` yields no events.
fn wait(ep: &impl AsFd, events: &mut Vec<epoll::Event>, timeout: Option<&Timespec>) -> Result<()> {
    events.clear();
    match epoll::wait(ep, spare_capacity(events), timeout) {
        Ok(_) | Err(Errno::INTR) => Ok(()),
        Err(e) => Err(e).context("epoll_wait"),
    }
}

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// One of section c's client connections.
struct ClientConn<S> {
    s: S,
    token: u64,
    seq: u64,
    /// The request in flight (sequence number and token in the first 16
    /// bytes, so a reply for another request or connection is caught).
    tx: [u8; MSG],
    tx_off: usize,
    rx: [u8; MSG],
    rx_off: usize,
    /// When the request was sent, in [`Clock`] ticks.
    sent: u64,
    /// Registered for `EPOLLOUT` (a request is partly written).
    out_armed: bool,
}

impl<S: Read + Write + AsFd> ClientConn<S> {
    /// Starts the next request.
    fn send(&mut self, ep: &impl AsFd, now: u64) -> Result<()> {
        self.seq += 1;
        self.tx[..8].copy_from_slice(&self.seq.to_le_bytes());
        self.tx_off = 0;
        self.sent = now;
        self.flush(ep)
    }

    /// Writes what it can of the request; waits for `EPOLLOUT` if the
    /// socket is full.
    fn flush(&mut self, ep: &impl AsFd) -> Result<()> {
        while self.tx_off < MSG {
            match self.s.write(&self.tx[self.tx_off..]) {
                Ok(0) => bail!("write returned 0"),
                Ok(k) => self.tx_off += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !self.out_armed {
                        self.rearm(ep, epoll::EventFlags::IN | epoll::EventFlags::OUT)?;
                        self.out_armed = true;
                    }
                    return Ok(());
                }
                Err(e) => return Err(e).context("writing request"),
            }
        }
        if self.out_armed {
            self.rearm(ep, epoll::EventFlags::IN)?;
            self.out_armed = false;
        }
        Ok(())
    }

    fn rearm(&self, ep: &impl AsFd, flags: epoll::EventFlags) -> Result<()> {
        epoll::modify(ep, &self.s, epoll::EventData::new_u64(self.token), flags)
            .context("epoll_ctl(MOD)")
    }

    /// One `read`; true when the reply is complete (and checked).
    fn on_readable(&mut self) -> Result<bool> {
        match self.s.read(&mut self.rx[self.rx_off..]) {
            Ok(0) => bail!("the server closed connection {}", self.token),
            Ok(k) => {
                self.rx_off += k;
                if self.rx_off < MSG {
                    return Ok(false);
                }
                ensure!(
                    self.tx_off == MSG && self.rx == self.tx,
                    "reply {} on connection {} does not echo the request",
                    self.seq,
                    self.token
                );
                self.rx_off = 0;
                Ok(true)
            }
            Err(e) if would_block(&e) => Ok(false),
            Err(e) => Err(e).context("reading reply"),
        }
    }
}

/// Section c's client: `job.conns` nonblocking connections driven by one
/// epoll loop (level-triggered), one [`MSG`]-byte request in flight on each.
/// Runs `job.warm` unmeasured, then records every reply received during
/// `job.measure`, then stops sending and waits for the replies in flight.
pub(super) fn epoll_client<S: Read + Write + AsFd>(
    mut connect: impl FnMut() -> io::Result<S>,
    child: Option<&mut ServerChild>,
    job: &Job,
) -> Result<Outcome> {
    let n = job.conns;
    let first = retry_connect(&mut connect, child, READY_TIMEOUT)?;
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).context("epoll_create")?;
    let base = pattern(MSG);
    let mut conns = Vec::with_capacity(n);
    let mut next = Some(first);
    for i in 0..n {
        let s = match next.take() {
            Some(s) => s,
            None => connect().with_context(|| format!("connect #{i}"))?,
        };
        set_nonblocking(&s)?;
        let token = i as u64;
        epoll::add(
            &ep,
            &s,
            epoll::EventData::new_u64(token),
            epoll::EventFlags::IN,
        )
        .context("epoll_ctl(ADD)")?;
        let mut tx = [0u8; MSG];
        tx.copy_from_slice(&base);
        tx[8..16].copy_from_slice(&token.to_le_bytes());
        conns.push(ClientConn {
            s,
            token,
            seq: 0,
            tx,
            tx_off: MSG,
            rx: [0; MSG],
            rx_off: 0,
            sent: 0,
            out_armed: false,
        });
    }

    // Touched before any request leaves (see `xio_loop_client`).
    let mut samples = presized(sample_room(job.measure));
    let clock = Clock::start();
    let start = clock.now();
    let t_measure = start + clock.ticks(job.warm);
    let t_end = t_measure + clock.ticks(job.measure);
    let t_drain = t_end + clock.ticks(DRAIN_TIMEOUT);
    for c in &mut conns {
        c.send(&ep, start)?;
    }
    let mut in_flight = n;
    let mut events = Vec::with_capacity(n.min(1024));
    // Wake up now and then even with nothing to do, to notice the deadlines.
    let tick = Timespec {
        tv_sec: 0,
        tv_nsec: 10_000_000,
    };
    while in_flight > 0 {
        wait(&ep, &mut events, Some(&tick))?;
        let mut now = clock.now();
        ensure!(
            now < t_drain,
            "{in_flight} replies still missing {DRAIN_TIMEOUT:?} after the end"
        );
        for ev in &events {
            let (flags, data) = (ev.flags, ev.data);
            let c = &mut conns[data.u64() as usize];
            if flags.contains(epoll::EventFlags::OUT) && c.tx_off < MSG {
                c.flush(&ep)?;
            }
            if !flags
                .intersects(epoll::EventFlags::IN | epoll::EventFlags::ERR | epoll::EventFlags::HUP)
                || !c.on_readable()?
            {
                continue;
            }
            now = clock.now();
            in_flight -= 1;
            if now >= t_measure && now <= t_end {
                samples.push(now - c.sent);
            }
            if now < t_end {
                c.send(&ep, now)?;
                in_flight += 1;
            }
        }
    }
    // Dropping the connections closes them; the server exits when all are
    // closed.
    drop(conns);
    to_ns(&mut samples, clock.ns_per_tick());
    Ok(Outcome {
        ops: samples.len() as u64,
        samples,
        wall: job.measure,
        ..Default::default()
    })
}

/// One of section c's server connections: echoes whatever arrives.
struct EchoConn<S> {
    s: S,
    token: u64,
    buf: Vec<u8>,
    /// `buf[off..len]` is still to be written back.
    off: usize,
    len: usize,
    /// Registered for `EPOLLOUT` only (a reply is partly written).
    out_armed: bool,
}

impl<S: Read + Write + AsFd> EchoConn<S> {
    /// Handles one event; false when the peer closed the connection.
    fn on_event(&mut self, ep: &impl AsFd) -> Result<bool> {
        if self.off < self.len {
            return self.flush(ep);
        }
        match self.s.read(&mut self.buf) {
            Ok(0) => Ok(false),
            Ok(k) => {
                self.off = 0;
                self.len = k;
                self.flush(ep)
            }
            Err(e) if would_block(&e) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(false),
            Err(e) => Err(e).context("reading request"),
        }
    }

    /// Writes what it can of the pending reply; while some is left, waits
    /// for `EPOLLOUT` instead of reading more.
    fn flush(&mut self, ep: &impl AsFd) -> Result<bool> {
        while self.off < self.len {
            match self.s.write(&self.buf[self.off..self.len]) {
                Ok(0) => bail!("write returned 0"),
                Ok(k) => self.off += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !self.out_armed {
                        self.rearm(ep, epoll::EventFlags::OUT)?;
                        self.out_armed = true;
                    }
                    return Ok(true);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                    ) =>
                {
                    return Ok(false)
                }
                Err(e) => return Err(e).context("writing reply"),
            }
        }
        if self.out_armed {
            self.rearm(ep, epoll::EventFlags::IN)?;
            self.out_armed = false;
        }
        Ok(true)
    }

    fn rearm(&self, ep: &impl AsFd, flags: epoll::EventFlags) -> Result<()> {
        epoll::modify(ep, &self.s, epoll::EventData::new_u64(self.token), flags)
            .context("epoll_ctl(MOD)")
    }
}

/// Section c's server: one epoll loop (level-triggered) that accepts `n`
/// connections and echoes on all of them; returns when all `n` are closed.
pub(super) fn epoll_server<L>(l: &L, n: usize) -> Result<()>
where
    L: Listen + AsFd,
    L::Stream: AsFd,
{
    set_nonblocking(l)?;
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).context("epoll_create")?;
    epoll::add(
        &ep,
        l,
        epoll::EventData::new_u64(LISTENER_TOKEN),
        epoll::EventFlags::IN,
    )
    .context("epoll_ctl(ADD)")?;
    let mut conns: Vec<Option<EchoConn<L::Stream>>> = Vec::with_capacity(n);
    let mut open = 0usize;
    let mut events = Vec::with_capacity(n.min(1024) + 1);
    while conns.len() < n || open > 0 {
        wait(&ep, &mut events, None)?;
        for ev in &events {
            let token = { ev.data }.u64();
            if token == LISTENER_TOKEN {
                while conns.len() < n {
                    let s = match l.accept_stream() {
                        Ok(s) => s,
                        Err(e) if would_block(&e) => break,
                        Err(e) => return Err(e).context("accept"),
                    };
                    set_nonblocking(&s)?;
                    let token = conns.len() as u64;
                    epoll::add(
                        &ep,
                        &s,
                        epoll::EventData::new_u64(token),
                        epoll::EventFlags::IN,
                    )
                    .context("epoll_ctl(ADD)")?;
                    conns.push(Some(EchoConn {
                        s,
                        token,
                        buf: vec![0; 4096],
                        off: 0,
                        len: 0,
                        out_armed: false,
                    }));
                    open += 1;
                }
                if conns.len() == n {
                    epoll::delete(&ep, l).context("epoll_ctl(DEL)")?;
                }
                continue;
            }
            let slot = &mut conns[token as usize];
            let Some(c) = slot.as_mut() else { continue };
            if !c.on_event(&ep)? {
                epoll::delete(&ep, &c.s).context("epoll_ctl(DEL)")?;
                *slot = None;
                open -= 1;
            }
        }
    }
    Ok(())
}
