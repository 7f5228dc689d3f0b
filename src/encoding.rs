//! HTTP content codings (RFC 9110 section 8.4): which ones sluice decodes, and an incremental
//! decoder with bounded output, used for compressed request bodies and for the response bytes
//! sluice must read (the completion detector, the read tool's rounds). The codecs are
//! `compression-codecs` (the codec layer of `async-compression`): flate2, brotli and zstd.

use compression_codecs::core::util::{PartialBuffer, WriteBuffer};
use compression_codecs::{BrotliDecoder, DecodeV2, GzipDecoder, ZlibDecoder, ZstdDecoder};
use http::header::{self, HeaderMap, HeaderValue};

/// Decoded bytes handed on at a time: a compressed chunk that inflates a thousandfold is
/// decoded piece by piece, never into one buffer of its own size.
const PIECE_BYTES: usize = 16 * 1024;

/// A content coding sluice can decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Identity,
    Gzip,
    /// HTTP's `deflate` is the zlib format (RFC 9110 section 8.4.1.2).
    Deflate,
    Brotli,
    Zstd,
}

/// The codings sluice decodes, by their `Content-Encoding` names.
const DECODABLE: [(&str, Coding); 6] = [
    ("identity", Coding::Identity),
    ("gzip", Coding::Gzip),
    ("x-gzip", Coding::Gzip),
    ("deflate", Coding::Deflate),
    ("br", Coding::Brotli),
    ("zstd", Coding::Zstd),
];

impl Coding {
    fn named(name: &str) -> Option<Coding> {
        DECODABLE
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, c)| *c)
    }

    /// The coding a message's `Content-Encoding` names (none: identity). `Err` carries the
    /// header's text when sluice cannot decode it: an unknown coding, or several stacked.
    pub fn of(headers: &HeaderMap) -> Result<Coding, String> {
        let mut found = Coding::Identity;
        for value in headers.get_all(header::CONTENT_ENCODING) {
            let text = value.to_str().map_err(|_| "(not text)".to_string())?;
            for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                match Coding::named(name) {
                    Some(Coding::Identity) => {}
                    Some(coding) if found == Coding::Identity => found = coding,
                    _ => return Err(text.chars().take(100).collect()),
                }
            }
        }
        Ok(found)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Coding::Identity => "identity",
            Coding::Gzip => "gzip",
            Coding::Deflate => "deflate",
            Coding::Brotli => "br",
            Coding::Zstd => "zstd",
        }
    }
}

/// Leaves in the client's `Accept-Encoding` only the codings sluice can decode (their weights
/// kept), for a request whose response sluice may have to read; removes the header when none is
/// left, and the upstream then answers uncompressed.
pub fn keep_decodable_accept(headers: &mut HeaderMap) {
    fn entries(value: &HeaderValue) -> impl Iterator<Item = &str> {
        let text = value.to_str().ok().unwrap_or_default();
        text.split(',').map(str::trim).filter(|e| !e.is_empty())
    }
    let decodable = |entry: &str| {
        let name = entry.split(';').next().unwrap_or_default().trim();
        Coding::named(name).is_some()
    };
    // What real clients send (`gzip, deflate, br`, once): every coding decodable, the header
    // kept exactly as it is, checked without collecting anything.
    let mut values = headers.get_all(header::ACCEPT_ENCODING).iter();
    if let (Some(one), None) = (values.next(), values.next()) {
        if entries(one).next().is_some() && entries(one).all(decodable) {
            return;
        }
    }
    let kept: Vec<&str> = headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .flat_map(entries)
        .filter(|entry| decodable(entry))
        .collect();
    match HeaderValue::from_str(&kept.join(", ")) {
        Ok(value) if !kept.is_empty() => headers.insert(header::ACCEPT_ENCODING, value),
        _ => headers.remove(header::ACCEPT_ENCODING),
    };
}

/// Why a body could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError<E> {
    #[error("the {0} data is corrupt")]
    Corrupt(&'static str),
    #[error("the {0} data ends early")]
    Truncated(&'static str),
    /// The sink refused more (for instance: past a size limit).
    #[error(transparent)]
    Sink(E),
}

/// Decoded output would pass the caller's limit.
#[derive(Debug, thiserror::Error)]
#[error("the decoded body is over its limit")]
pub struct TooLarge;

/// An incremental decoder: compressed bytes in as they arrive, decoded pieces of at most
/// [`PIECE_BYTES`] out to a sink, so memory stays bounded whatever the compression ratio.
pub struct Decoder {
    coding: Coding,
    inner: Box<dyn DecodeV2 + Send + Sync>,
    buffer: Box<[u8]>,
    /// The current stream (gzip: member) reached its end.
    ended: bool,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("coding", &self.coding)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl Decoder {
    /// A decoder for `coding`; `None` for identity, which needs none.
    pub fn new(coding: Coding) -> Option<Decoder> {
        let inner: Box<dyn DecodeV2 + Send + Sync> = match coding {
            Coding::Identity => return None,
            Coding::Gzip => Box::new(GzipDecoder::new()),
            Coding::Deflate => Box::new(ZlibDecoder::new()),
            Coding::Brotli => Box::new(BrotliDecoder::new()),
            Coding::Zstd => Box::new(ZstdDecoder::new()),
        };
        Some(Decoder {
            coding,
            inner,
            buffer: vec![0; PIECE_BYTES].into_boxed_slice(),
            ended: false,
        })
    }

    pub fn coding(&self) -> Coding {
        self.coding
    }

    /// Decodes `input`, handing each decoded piece to `sink` in order.
    pub fn feed<E>(
        &mut self,
        mut input: &[u8],
        sink: &mut dyn FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), DecodeError<E>> {
        let name = self.coding.as_str();
        // Input left, or a full output buffer (the decoder may hold more for this input).
        let mut more = !input.is_empty();
        while more {
            let drain = input.is_empty();
            if self.ended {
                if drain {
                    break;
                }
                // More after the end: a further gzip member (RFC 1952 allows several), or, for
                // the other codings, trailing bytes that the restarted decoder refuses.
                self.inner
                    .reinit()
                    .map_err(|_| DecodeError::Corrupt(name))?;
                self.ended = false;
            }
            let mut from = PartialBuffer::new(input);
            let mut out = WriteBuffer::new_initialized(&mut self.buffer);
            match self.inner.decode(&mut from, &mut out) {
                Ok(ended) => self.ended = ended,
                // Draining with no input: a decoder with nothing more to give may say so as an
                // error (flate's BufError); real corruption shows with the next input or at the
                // end.
                Err(_) if drain => break,
                Err(_) => return Err(DecodeError::Corrupt(name)),
            }
            let (consumed, produced) = (from.written_len(), out.written_len());
            let full = out.has_no_spare_space();
            if produced > 0 {
                sink(&self.buffer[..produced]).map_err(DecodeError::Sink)?;
            }
            if !drain && consumed == 0 && produced == 0 && !self.ended {
                return Err(DecodeError::Corrupt(name));
            }
            input = &input[consumed..];
            more = !input.is_empty() || (full && !self.ended);
        }
        Ok(())
    }

    /// Decodes `input` (with `None`: the end of the input) onto `out`, refusing to let `out`
    /// grow past `limit` bytes.
    pub fn decode_into(
        &mut self,
        input: Option<&[u8]>,
        out: &mut Vec<u8>,
        limit: usize,
    ) -> Result<(), DecodeError<TooLarge>> {
        let mut sink = |piece: &[u8]| {
            if out.len() + piece.len() > limit {
                return Err(TooLarge);
            }
            out.extend_from_slice(piece);
            Ok(())
        };
        match input {
            Some(input) => self.feed(input, &mut sink),
            None => self.finish(&mut sink),
        }
    }

    /// The input has ended: the rest of the output, or `Truncated` when the compressed data
    /// stopped before its end.
    pub fn finish<E>(
        &mut self,
        sink: &mut dyn FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), DecodeError<E>> {
        let name = self.coding.as_str();
        if !self.ended {
            return Err(DecodeError::Truncated(name));
        }
        loop {
            let mut out = WriteBuffer::new_initialized(&mut self.buffer);
            let done = self
                .inner
                .finish(&mut out)
                .map_err(|_| DecodeError::Corrupt(name))?;
            let produced = out.written_len();
            if produced > 0 {
                sink(&self.buffer[..produced]).map_err(DecodeError::Sink)?;
            }
            if done || produced == 0 {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::io::Write;

    fn encode(coding: Coding, data: &[u8]) -> Vec<u8> {
        match coding {
            Coding::Identity => data.to_vec(),
            Coding::Gzip => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Coding::Deflate => {
                let mut e =
                    flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Coding::Brotli => {
                let mut out = Vec::new();
                {
                    let mut e = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
                    e.write_all(data).unwrap();
                }
                out
            }
            Coding::Zstd => zstd::encode_all(data, 3).unwrap(),
        }
    }

    const ALL: [Coding; 4] = [Coding::Gzip, Coding::Deflate, Coding::Brotli, Coding::Zstd];

    fn decode_in_chunks(coding: Coding, data: &[u8], chunk: usize) -> Result<Vec<u8>, String> {
        let mut d = Decoder::new(coding).unwrap();
        let mut out = Vec::new();
        let mut sink = |piece: &[u8]| {
            assert!(piece.len() <= PIECE_BYTES);
            out.extend_from_slice(piece);
            Ok::<(), Infallible>(())
        };
        for part in data.chunks(chunk) {
            d.feed(part, &mut sink).map_err(|e| e.to_string())?;
        }
        d.finish(&mut sink).map_err(|e| e.to_string())?;
        Ok(out)
    }

    #[test]
    fn every_coding_round_trips_whatever_the_chunking() {
        let text: Vec<u8> = (0..200_000u32)
            .flat_map(|i| format!("line {i} of a tool's output\n").into_bytes())
            .collect();
        for coding in ALL {
            let packed = encode(coding, &text);
            for chunk in [1, 7, 1000, packed.len()] {
                assert_eq!(
                    decode_in_chunks(coding, &packed, chunk).unwrap(),
                    text,
                    "{coding:?} in chunks of {chunk}"
                );
            }
        }
    }

    #[test]
    fn cut_and_corrupt_data_are_errors_not_panics() {
        let text = b"data: {\"type\":\"message_stop\"}\n\n".repeat(100);
        for coding in ALL {
            let packed = encode(coding, &text);
            let cut = &packed[..packed.len() / 2];
            assert!(decode_in_chunks(coding, cut, 5).is_err(), "{coding:?} cut");
            let mut garbage = packed.clone();
            for b in garbage.iter_mut().skip(2).step_by(3) {
                *b ^= 0x5a;
            }
            let _ = decode_in_chunks(coding, &garbage, 5); // must not panic
            assert!(decode_in_chunks(coding, b"not compressed at all", 5).is_err());
        }
    }

    #[test]
    fn a_sink_error_stops_a_bomb_early() {
        let zeros = vec![0u8; 50 * 1024 * 1024];
        for coding in ALL {
            let packed = encode(coding, &zeros);
            assert!(packed.len() < 1024 * 1024, "{coding:?} packs zeros small");
            let mut d = Decoder::new(coding).unwrap();
            let mut seen = 0usize;
            let result = d.feed(&packed, &mut |piece: &[u8]| {
                seen += piece.len();
                if seen > 1024 * 1024 {
                    Err("too large")
                } else {
                    Ok(())
                }
            });
            assert!(matches!(result, Err(DecodeError::Sink("too large"))));
            assert!(seen <= 1024 * 1024 + PIECE_BYTES);
        }
    }

    #[test]
    fn concatenated_gzip_members_decode_as_one_body() {
        let mut both = encode(Coding::Gzip, b"first ");
        both.extend(encode(Coding::Gzip, b"second"));
        assert_eq!(
            decode_in_chunks(Coding::Gzip, &both, 3).unwrap(),
            b"first second"
        );
    }

    #[test]
    fn content_encoding_names() {
        let of = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_ENCODING, v.parse().unwrap());
            Coding::of(&h)
        };
        assert_eq!(Coding::of(&HeaderMap::new()), Ok(Coding::Identity));
        assert_eq!(of("gzip"), Ok(Coding::Gzip));
        assert_eq!(of("X-GZIP"), Ok(Coding::Gzip));
        assert_eq!(of("br"), Ok(Coding::Brotli));
        assert_eq!(of("zstd"), Ok(Coding::Zstd));
        assert_eq!(of("deflate"), Ok(Coding::Deflate));
        assert_eq!(of("identity"), Ok(Coding::Identity));
        assert!(of("compress").is_err());
        assert!(of("gzip, br").is_err());
    }

    #[test]
    fn accept_encoding_keeps_only_decodable_codings() {
        let accept = |values: &[&str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(header::ACCEPT_ENCODING, v.parse().unwrap());
            }
            keep_decodable_accept(&mut h);
            let left: Vec<_> = h.get_all(header::ACCEPT_ENCODING).iter().collect();
            assert!(left.len() <= 1, "{left:?}");
            left.first().map(|v| v.to_str().unwrap().to_string())
        };
        assert_eq!(
            accept(&["gzip, deflate, br, zstd"]).as_deref(),
            Some("gzip, deflate, br, zstd")
        );
        assert_eq!(accept(&["zstd,gzip"]).as_deref(), Some("zstd,gzip"));
        assert_eq!(accept(&["GZip;q=0.5"]).as_deref(), Some("GZip;q=0.5"));
        assert_eq!(
            accept(&["zstd;q=1.0, compress, *;q=0.1"]).as_deref(),
            Some("zstd;q=1.0")
        );
        // Several headers, each decodable: joined into one.
        assert_eq!(accept(&["gzip", "br"]).as_deref(), Some("gzip, br"));
        assert_eq!(accept(&["compress, *"]), None);
        assert_eq!(accept(&[" , "]), None);
        assert_eq!(accept(&[]), None);
    }
}
