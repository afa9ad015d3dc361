//! Reading a connection: reads (into initialised or uninitialised memory,
//! one buffer or several), peeks, zero-copy takes of whole chunks, and the
//! readiness a poller starting late must hear of.

use std::net::SocketAddr;

use super::{Chunk, ConnError, ConnId, State, Table, INDEX_BITS};

/// Initialised bytes as the `MaybeUninit` slice a read writes into.
/// Only for writers that never de-initialise (ours copy bytes in).
pub(crate) fn as_uninit(out: &mut [u8]) -> &mut [std::mem::MaybeUninit<u8>] {
    // SAFETY: initialised bytes are valid `MaybeUninit<u8>`s, same layout;
    // the callers only write initialised bytes through the result.
    unsafe { &mut *(out as *mut [u8] as *mut [std::mem::MaybeUninit<u8>]) }
}

impl<B: Chunk> Table<B> {
    /// Copies received bytes into `out`: `Ok(0)` is end of stream (after
    /// every byte sent before the FIN). Bytes come in order, and a read
    /// may return part of one buffer or parts of several.
    #[cfg(any(test, feature = "test-support"))]
    pub fn read(&mut self, c: ConnId, out: &mut [u8]) -> Result<usize, ConnError> {
        self.read_uninit(c, as_uninit(out))
    }

    /// [`Table::read`] into memory that may be uninitialised (a runtime's
    /// read buffer): the first `n` bytes of `out` are written, nothing else
    /// is touched.
    #[cfg(any(test, feature = "test-support"))]
    pub fn read_uninit(
        &mut self,
        c: ConnId,
        out: &mut [std::mem::MaybeUninit<u8>],
    ) -> Result<usize, ConnError> {
        self.read_uninit_with(c, out, drop)
    }

    /// As [`Self::read_uninit`], handing each chunk read to the end to
    /// `spent` instead of dropping it (the socket layer reuses their
    /// buffers for its next writes).
    pub fn read_uninit_with(
        &mut self,
        c: ConnId,
        out: &mut [std::mem::MaybeUninit<u8>],
        spent: impl FnMut(B),
    ) -> Result<usize, ConnError> {
        self.read_vectored_uninit_with(c, std::iter::once(out), spent)
    }

    /// As [`Self::read_uninit_with`] into several buffers, filled in order
    /// as far as the received bytes go (as `readv` on a TCP socket): a
    /// buffer is only started once the ones before it are full. Empty
    /// buffers are skipped; if all are, the read is `Ok(0)` at once.
    pub fn read_vectored_uninit_with<'o>(
        &mut self,
        c: ConnId,
        outs: impl IntoIterator<Item = &'o mut [std::mem::MaybeUninit<u8>]>,
        mut spent: impl FnMut(B),
    ) -> Result<usize, ConnError> {
        let e = self.get_mut(c).ok_or(ConnError::NotConnected)?;
        if e.state == State::Reset && e.rx.is_empty() {
            return e.read_reset().map(|()| 0);
        }
        if e.read_shut {
            return Ok(0);
        }
        let mut n = 0;
        let mut consumed = 0;
        let mut room = false;
        'outs: for out in outs {
            room |= !out.is_empty();
            let mut m = 0;
            while m < out.len() {
                let Some(front) = e.rx.front() else {
                    break 'outs;
                };
                let bytes = &front.as_ref()[e.offset..];
                let k = bytes.len().min(out.len() - m);
                for (d, &b) in out[m..m + k].iter_mut().zip(&bytes[..k]) {
                    d.write(b);
                }
                m += k;
                n += k;
                e.offset += k;
                if e.offset == front.as_ref().len() {
                    consumed += front.footprint();
                    if let Some(b) = e.rx.pop_front() {
                        spent(b);
                    }
                    e.offset = 0;
                }
            }
        }
        let fin = e.peer_fin;
        if consumed > 0 {
            self.consumed(c, consumed);
        }
        if n > 0 || !room {
            Ok(n)
        } else if fin {
            Ok(0)
        } else {
            Err(ConnError::WouldBlock)
        }
    }

    /// [`Table::peek`] as `MSG_PEEK` has it: a reset it reports is
    /// reported once, as by a read (Linux's peek clears the socket's
    /// error too: the next peek or read is end of stream, `SO_ERROR` 0).
    pub fn peek_reporting(&mut self, c: ConnId, out: &mut [u8]) -> Result<usize, ConnError> {
        let e = self.get_mut(c).ok_or(ConnError::NotConnected)?;
        if e.state == State::Reset && e.rx.is_empty() {
            return e.read_reset().map(|()| 0);
        }
        self.peek(c, out)
    }

    /// Copies received bytes into `out` without consuming them (a later
    /// read returns them again): `Ok(0)` is end of stream. A reset it
    /// reports is left for the next read (readiness looks with this).
    pub fn peek(&mut self, c: ConnId, out: &mut [u8]) -> Result<usize, ConnError> {
        let e = self.get(c).ok_or(ConnError::NotConnected)?;
        if e.state == State::Reset && e.rx.is_empty() {
            return if (e.reset_reported || e.peer_fin) && !e.refused {
                Ok(0)
            } else {
                Err(e.reset_error())
            };
        }
        if e.read_shut {
            return Ok(0);
        }
        let mut n = 0;
        let mut offset = e.offset;
        for b in &e.rx {
            if n == out.len() {
                break;
            }
            let bytes = &b.as_ref()[offset..];
            let k = bytes.len().min(out.len() - n);
            out[n..n + k].copy_from_slice(&bytes[..k]);
            n += k;
            offset = 0;
        }
        if n > 0 || out.is_empty() {
            Ok(n)
        } else if e.peer_fin {
            Ok(0)
        } else {
            Err(ConnError::WouldBlock)
        }
    }

    /// Takes the next received chunk whole (the zero-copy read), with the
    /// number of its bytes already consumed by ordinary reads. `Ok(None)`
    /// is end of stream.
    pub fn take_chunk(&mut self, c: ConnId) -> Result<Option<(B, usize)>, ConnError> {
        let e = self.get_mut(c).ok_or(ConnError::NotConnected)?;
        if e.state == State::Reset && e.rx.is_empty() {
            return e.read_reset().map(|()| None);
        }
        if e.read_shut {
            return Ok(None);
        }
        match e.rx.pop_front() {
            Some(b) => {
                let off = std::mem::take(&mut e.offset);
                self.consumed(c, b.footprint());
                Ok(Some((b, off)))
            }
            None if e.peer_fin => Ok(None),
            None => Err(ConnError::WouldBlock),
        }
    }

    /// What a poller starting late must hear of, as epoll reports a
    /// socket's readiness when it is added: the connections a read would
    /// not wait on, and those a write may go on (connected: every one not
    /// waiting for its SYN-ACK), as (connection, readable, writable); and
    /// listeners with connections to accept.
    pub fn ready_now(&self) -> (Vec<(ConnId, bool, bool)>, Vec<SocketAddr>) {
        let conns = self
            .entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let e = e.as_ref().filter(|e| !e.unaccepted && !e.closed)?;
                let readable =
                    !e.rx.is_empty() || e.peer_fin || e.read_shut || e.state == State::Reset;
                let writable = readable || e.state != State::SynSent;
                (readable || writable).then_some((
                    ConnId(e.gen << INDEX_BITS | i as u32),
                    readable,
                    writable,
                ))
            })
            .collect();
        let accepts = self
            .listeners
            .iter()
            .filter(|(_, l)| !l.queue.is_empty())
            .map(|(a, _)| *a)
            .collect();
        (conns, accepts)
    }

    /// Whether nothing more can come from the peer on `c` that a close
    /// should look at: its FIN or a reset is in, or this end shut reads
    /// (what comes then is dropped anyway).
    pub fn input_ended(&self, c: ConnId) -> bool {
        self.get(c)
            .is_none_or(|e| e.peer_fin || e.read_shut || e.state == State::Reset)
    }

    /// How many received bytes a read on `c` finds now, not counting
    /// what is still in its ring (`FIONREAD`); 0 once reads are shut.
    pub fn queued(&self, c: ConnId) -> usize {
        self.get(c).map_or(0, |e| {
            if e.read_shut {
                return 0;
            }
            let total: usize = e.rx.iter().map(|b| b.as_ref().len()).sum();
            total - e.offset.min(total)
        })
    }

    /// Whether a read on `c` would return at once (data, end, or error).
    pub fn is_readable(&self, c: ConnId) -> bool {
        self.get(c).is_none_or(|e| {
            !e.rx.is_empty() || e.peer_fin || e.read_shut || e.state == State::Reset
        })
    }
}
