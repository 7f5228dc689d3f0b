//! Request bodies: bounded, paced reading; decoding off the I/O thread; draining; small responses.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use crate::dialect::resume::{Received, Receiving, RESUME_FROM};
use crate::encoding::{Coding, DecodeError, Decoder, TooLarge};
use crate::error::GatewayError;

use super::{Body, BODY_GRACE, BODY_MIN_BYTES_PER_SECOND, BODY_ROOM_WAIT};

/// Bytes a body reader takes in before it lets the worker's other connections run. tokio's
/// budget counts reads, not bytes: a client that keeps its socket full (on loopback, or behind
/// a fast link) is read up to 128 times in one turn, and every other connection of the worker
/// waits that long. A small request waited 30-60 ms behind a 13 MB upload so (`cargo bench
/// --bench noisy_neighbour`; docs/runtime.md). 64 KiB is about a socket read's worth.
const YIELD_EVERY_BYTES: usize = 64 * 1024;

/// Counts the bytes a reader took in since it last let others run, and lets them run past
/// [`YIELD_EVERY_BYTES`] unless the body has ended (a body that came in one chunk never waits).
#[derive(Default)]
struct Turn {
    since: usize,
}

impl Turn {
    async fn took(&mut self, bytes: usize, ended: bool) {
        self.since += bytes;
        if self.since >= YIELD_EVERY_BYTES && !ended {
            self.since = 0;
            SchedulerTurn::default().await;
        }
    }
}

/// Ready only once the worker's scheduler has polled its other work (its sockets included) and
/// come back to this task. `tokio::task::yield_now` is ready at its second poll, whoever makes
/// it: hyper polls a request's handler up to 16 times in one turn of its connection's task, so
/// a reader that yielded with it went on reading in that same turn, and a neighbour's small
/// request waited up to 100 ms behind a 13 MB upload (docs/runtime.md, "A yield that yields").
#[derive(Default)]
struct SchedulerTurn {
    waiting: Option<Arc<Woken>>,
}

/// The task's waker, noting that it was called.
struct Woken {
    called: std::sync::atomic::AtomicBool,
    task: std::task::Waker,
}

impl std::task::Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.called
            .store(true, std::sync::atomic::Ordering::Release);
        self.task.wake_by_ref();
    }
}

impl std::future::Future for SchedulerTurn {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        use std::task::Poll;
        if let Some(woken) = &self.waiting {
            return if woken.called.load(std::sync::atomic::Ordering::Acquire) {
                Poll::Ready(())
            } else {
                Poll::Pending
            };
        }
        let woken = Arc::new(Woken {
            called: false.into(),
            task: cx.waker().clone(),
        });
        // tokio's yield hands our waker to the scheduler, which calls it after it has looked at
        // the worker's sockets and run what they woke.
        let waker = std::task::Waker::from(woken.clone());
        let mut yielded = std::pin::pin!(tokio::task::yield_now());
        let _ = yielded
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker));
        self.waiting = Some(woken);
        Poll::Pending
    }
}

/// Reads a request body, refusing it as soon as it passes `limit` bytes (P4: 413), and at once
/// when its declared length already does; one that has not fully arrived within `timeout` gets
/// 408. Each chunk takes its room under `max_inflight_body_bytes` (`room`) first: the permit
/// returned holds it until dropped; no room within [`BODY_ROOM_WAIT`] is a 503, after the rest
/// of the body is read and dropped (so the client can read the answer). A single-chunk body is
/// kept without a copy; a longer one is copied into one buffer as it arrives (sized by its
/// `content-length`), so the body never takes twice its size. `as_text`: a body long enough
/// to be read from an earlier turn's trail has its blocks hashed, and from a second chunk on is
/// checked as UTF-8, while each chunk is in hand ([`Receiving`]); reading its view later costs
/// no pass over cold bytes.
pub(super) async fn read_body(
    mut incoming: Incoming,
    headers: &http::HeaderMap,
    limit: u64,
    timeout: Duration,
    (room, tenant_room): (
        &Arc<tokio::sync::Semaphore>,
        Option<Arc<tokio::sync::Semaphore>>,
    ),
    as_text: bool,
) -> Result<(Bytes, Option<Received>, Option<BodyRoom>), GatewayError> {
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        drain(incoming).await;
        return Err(GatewayError::BodyTooLarge { limit });
    }
    let started = tokio::time::Instant::now();
    let (deadline, room_deadline) = (started + timeout, started + BODY_ROOM_WAIT);
    // Each byte received buys the body more time, at the minimum rate, after the grace.
    let paced = |total: u64| {
        started
            + BODY_GRACE
            + Duration::from_millis(total.saturating_mul(1000) / BODY_MIN_BYTES_PER_SECOND)
    };
    // The tenant's share first, never waited for: a tenant over it is refused (429) without
    // holding any of the room the others share.
    let mut mine = match (&tenant_room, declared) {
        (Some(share), Some(n)) => match try_room(share, n) {
            Some(permit) => Some(permit),
            None => {
                drain_within(incoming, limit, BODY_ROOM_WAIT).await;
                return Err(OVER_SHARE);
            }
        },
        _ => None,
    };
    // A body of declared length takes its whole room before a byte is read: bodies admitted
    // together can all finish, instead of each holding part of the room waiting for the rest.
    let mut held = match declared {
        Some(n) => match take_room(room, n, room_deadline).await {
            Some(permit) => Some(permit),
            None => {
                drain_within(incoming, limit, BODY_ROOM_WAIT).await;
                return Err(GatewayError::Overloaded);
            }
        },
        None => None,
    };
    let mut first: Option<Bytes> = None;
    let mut joined = bytes::BytesMut::new();
    let mut text = declared
        .filter(|&n| as_text && n >= RESUME_FROM as u64)
        .map(|n| Receiving::with_capacity(usize::try_from(n).unwrap_or(0)));
    let mut total = 0u64;
    let mut turn = Turn::default();
    loop {
        let until = deadline.min(paced(total));
        let frame = match tokio::time::timeout_at(until, incoming.frame()).await {
            Err(_) => {
                return Err(GatewayError::BodyTimeout {
                    seconds: timeout.as_secs_f64(),
                })
            }
            Ok(None) => break,
            Ok(Some(frame)) => frame,
        };
        let frame = frame.map_err(|e| {
            tracing::debug!(error = %e, "client body read failed");
            GatewayError::ClientBody
        })?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        total += data.len() as u64;
        turn.took(data.len(), http_body::Body::is_end_stream(&incoming))
            .await;
        if total > limit {
            drain(incoming).await;
            return Err(GatewayError::BodyTooLarge { limit });
        }
        // Without a declared length, each chunk takes its room as it comes.
        if declared.is_none() {
            if let Some(share) = &tenant_room {
                match try_room(share, data.len() as u64) {
                    Some(permit) => match &mut mine {
                        Some(mine) => mine.merge(permit),
                        None => mine = Some(permit),
                    },
                    None => {
                        drop((first, joined, held, mine, data, text));
                        drain_within(incoming, limit, BODY_ROOM_WAIT).await;
                        return Err(OVER_SHARE);
                    }
                }
            }
            match take_room(room, data.len() as u64, room_deadline).await {
                Some(permit) => match &mut held {
                    Some(held) => held.merge(permit),
                    None => held = Some(permit),
                },
                None => {
                    drop((first, joined, held, mine, data, text));
                    drain_within(incoming, limit, BODY_ROOM_WAIT).await;
                    return Err(GatewayError::Overloaded);
                }
            }
        }
        if let Some(text) = &mut text {
            text.push(data);
            continue;
        }
        match first.take() {
            None if joined.is_empty() => first = Some(data),
            None => joined.extend_from_slice(&data),
            Some(earlier) => {
                let size = declared.map_or(0, |n| usize::try_from(n).unwrap_or(0));
                joined.reserve(size.max(earlier.len() + data.len()));
                joined.extend_from_slice(&earlier);
                joined.extend_from_slice(&data);
            }
        }
    }
    let held = held.map(|all| BodyRoom {
        _all: all,
        _tenant: mine,
    });
    if let Some(text) = text {
        let (body, received) = text.finish();
        return Ok((body, received, held));
    }
    let body = first.unwrap_or_else(|| joined.freeze());
    Ok((body, None, held))
}

/// A body's room under `max_inflight_body_bytes` and, with `[limits]`, under its tenant's
/// share; given back when dropped.
pub(super) struct BodyRoom {
    _all: tokio::sync::OwnedSemaphorePermit,
    _tenant: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// A body that would pass its tenant's `tenant_inflight_body_bytes`: its own bodies in flight
/// end within seconds.
const OVER_SHARE: GatewayError = GatewayError::TenantLimited {
    limit: "body",
    retry_after: 1,
};

/// `bytes` of a tenant's share, now or not at all.
fn try_room(
    share: &Arc<tokio::sync::Semaphore>,
    bytes: u64,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    let mut left = bytes;
    let mut held = share.clone().try_acquire_many_owned(0).ok()?;
    while left > 0 {
        let piece = u32::try_from(left).unwrap_or(u32::MAX);
        held.merge(share.clone().try_acquire_many_owned(piece).ok()?);
        left -= u64::from(piece);
    }
    Some(held)
}

/// `bytes` of room under `max_inflight_body_bytes`, waited for until `deadline`.
async fn take_room(
    room: &Arc<tokio::sync::Semaphore>,
    bytes: u64,
    deadline: tokio::time::Instant,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    let mut left = bytes;
    let mut held = room.clone().try_acquire_many_owned(0).ok()?;
    while left > 0 {
        let piece = u32::try_from(left).unwrap_or(u32::MAX);
        let permit = tokio::time::timeout_at(deadline, room.clone().acquire_many_owned(piece));
        held.merge(permit.await.ok()?.ok()?);
        left -= u64::from(piece);
    }
    Some(held)
}

/// Decodes a compressed request body off the I/O thread, refusing it as soon as its decoded
/// size passes `limit` (a bomb costs at most `limit` bytes of memory and the CPU to get there).
pub(super) async fn decode_body(
    body: Bytes,
    coding: Coding,
    limit: u64,
) -> Result<Bytes, GatewayError> {
    let decoded = super::heavy::run(move || {
        let Some(mut decoder) = Decoder::new(coding) else {
            return Ok(body);
        };
        let cap = usize::try_from(limit).unwrap_or(usize::MAX);
        let mut out = Vec::with_capacity(body.len().saturating_mul(4).min(cap));
        decoder
            .decode_into(Some(&body), &mut out, cap)
            .and_then(|()| decoder.decode_into(None, &mut out, cap))
            .map_err(|e| match e {
                DecodeError::Sink(TooLarge) => GatewayError::BodyTooLarge { limit },
                other => GatewayError::BadEncoding(other.to_string()),
            })?;
        Ok(Bytes::from(out))
    })
    .await;
    decoded.map_err(|_| GatewayError::Internal)?
}

/// Bytes of a refused body still read (and dropped) so the client finishes sending and can read
/// the 413, instead of failing with a broken pipe.
pub(super) const DRAIN_MAX_BYTES: u64 = 8 * 1024 * 1024;
pub(super) const DRAIN_MAX_TIME: Duration = Duration::from_secs(2);

/// Reads and drops what is left of a refused body, within [`DRAIN_MAX_BYTES`] and
/// [`DRAIN_MAX_TIME`]; past either, the connection is closed with the response.
pub(super) async fn drain(incoming: Incoming) {
    drain_within(incoming, DRAIN_MAX_BYTES, DRAIN_MAX_TIME).await;
}

/// Reads and drops what is left of a body, up to `max` bytes and `time`. A body turned away
/// for want of room costs no memory to drain, only the bytes' passage.
async fn drain_within(mut incoming: Incoming, max: u64, time: Duration) {
    let _ = tokio::time::timeout(time, async move {
        let (mut dropped, mut turn) = (0u64, Turn::default());
        while let Some(Ok(frame)) = incoming.frame().await {
            let bytes = frame.data_ref().map_or(0, bytes::Buf::remaining);
            dropped += bytes as u64;
            turn.took(bytes, http_body::Body::is_end_stream(&incoming))
                .await;
            if dropped > max {
                break;
            }
        }
    })
    .await;
}

pub(super) fn plain(
    status: StatusCode,
    content_type: &'static str,
    bytes: Bytes,
) -> Response<Body> {
    let mut response = Response::new(full(bytes));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    response
}

pub(super) fn full(bytes: Bytes) -> Body {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::task::Poll;

    use super::SchedulerTurn;

    /// hyper polls a handler several times in one turn of its connection's task; a reader's
    /// turn must stay pending through those polls, and end only after the worker ran the rest.
    #[tokio::test(flavor = "current_thread")]
    async fn a_turn_ends_only_after_the_scheduler_ran_the_other_tasks() {
        let neighbour_ran = Arc::new(AtomicBool::new(false));
        let ran = neighbour_ran.clone();
        let neighbours = tokio_util::task::TaskTracker::new();
        neighbours.spawn(async move { ran.store(true, Ordering::Relaxed) });
        neighbours.close();
        let mut turn = std::pin::pin!(SchedulerTurn::default());
        std::future::poll_fn(|cx| {
            for _ in 0..16 {
                assert!(turn.as_mut().poll(cx).is_pending(), "ready within one poll");
            }
            Poll::Ready(())
        })
        .await;
        assert!(!neighbour_ran.load(Ordering::Relaxed));
        turn.await;
        assert!(neighbour_ran.load(Ordering::Relaxed));
        neighbours.wait().await;
    }
}
