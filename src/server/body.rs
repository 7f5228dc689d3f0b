//! Request bodies: bounded, paced reading; decoding off the I/O thread; draining; small responses.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use crate::encoding::{Coding, DecodeError, Decoder, TooLarge};
use crate::error::GatewayError;

use super::{Body, BODY_GRACE, BODY_MIN_BYTES_PER_SECOND, BODY_ROOM_WAIT};

/// Reads a request body, refusing it as soon as it passes `limit` bytes (P4: 413), and at once
/// when its declared length already does; one that has not fully arrived within `timeout` gets
/// 408. Each chunk takes its room under `max_inflight_body_bytes` (`room`) first: the permit
/// returned holds it until dropped; no room within [`BODY_ROOM_WAIT`] is a 503. A single-chunk
/// body is kept without a copy.
pub(super) async fn read_body(
    mut incoming: Incoming,
    headers: &http::HeaderMap,
    limit: u64,
    timeout: Duration,
    room: &Arc<tokio::sync::Semaphore>,
) -> Result<(Bytes, Option<tokio::sync::OwnedSemaphorePermit>), GatewayError> {
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
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut held: Option<tokio::sync::OwnedSemaphorePermit> = None;
    let mut total = 0u64;
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
        if total > limit {
            drain(incoming).await;
            return Err(GatewayError::BodyTooLarge { limit });
        }
        let wanted = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let permit =
            tokio::time::timeout_at(room_deadline, room.clone().acquire_many_owned(wanted));
        match permit.await {
            Ok(Ok(permit)) => match &mut held {
                Some(held) => held.merge(permit),
                None => held = Some(permit),
            },
            _ => return Err(GatewayError::Overloaded),
        }
        chunks.push(data);
    }
    let body = match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.swap_remove(0),
        _ => Bytes::from(chunks.concat()),
    };
    Ok((body, held))
}

/// Decodes a compressed request body off the I/O thread, refusing it as soon as its decoded
/// size passes `limit` (a bomb costs at most `limit` bytes of memory and the CPU to get there).
pub(super) async fn decode_body(
    body: Bytes,
    coding: Coding,
    limit: u64,
) -> Result<Bytes, GatewayError> {
    let decoded = tokio::task::spawn_blocking(move || {
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
pub(super) async fn drain(mut incoming: Incoming) {
    let _ = tokio::time::timeout(DRAIN_MAX_TIME, async move {
        let mut dropped = 0u64;
        while let Some(Ok(frame)) = incoming.frame().await {
            dropped += frame.data_ref().map_or(0, |d| d.len() as u64);
            if dropped > DRAIN_MAX_BYTES {
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
