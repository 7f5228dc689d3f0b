//! Images from their bytes (SPEC M2, A6): strict base64, the type from the magic bytes (a label
//! never decides), dimensions from the header alone under decoder limits, a cheap check that the
//! file is complete, and a deterministic downscale. Nothing here decodes pixels except
//! [`downscale`], which is only called when the route asks for it.

use std::io::Cursor;

use bytes::Bytes;
use image::{ImageFormat, ImageReader, Limits};

/// Pixels a downscale may decode (a 16k × 16k RGBA image); anything larger is refused, not
/// decoded.
const MAX_DECODE_PIXELS: u64 = 16_384 * 16_384;
/// Bytes the decoder may allocate while reading a header or downscaling.
const MAX_DECODE_ALLOC: u64 = 1024 * 1024 * 1024;

/// The image types every provider accepts (SPEC M2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageType {
    Png,
    Jpeg,
    Gif,
    Webp,
}

impl ImageType {
    pub fn mime(self) -> &'static str {
        match self {
            ImageType::Png => "image/png",
            ImageType::Jpeg => "image/jpeg",
            ImageType::Gif => "image/gif",
            ImageType::Webp => "image/webp",
        }
    }

    fn format(self) -> ImageFormat {
        match self {
            ImageType::Png => ImageFormat::Png,
            ImageType::Jpeg => ImageFormat::Jpeg,
            ImageType::Gif => ImageFormat::Gif,
            ImageType::Webp => ImageFormat::WebP,
        }
    }

    fn from_format(format: ImageFormat) -> Option<ImageType> {
        match format {
            ImageFormat::Png => Some(ImageType::Png),
            ImageFormat::Jpeg => Some(ImageType::Jpeg),
            ImageFormat::Gif => Some(ImageType::Gif),
            ImageFormat::WebP => Some(ImageType::Webp),
            _ => None,
        }
    }
}

/// Why an image cannot be shown. Stated once to the model, in a placeholder (SPEC A6).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the image data is not valid base64")]
    InvalidBase64,
    #[error("the image is empty")]
    Empty,
    #[error("the image data is {bytes} bytes, over the limit of {limit}")]
    TooLarge { bytes: u64, limit: u64 },
    #[error("the data is not a PNG, JPEG, GIF or WebP image")]
    Unsupported,
    #[error("the image file is damaged or incomplete")]
    Damaged,
    #[error("the image is {width}×{height} px, over the limit of {limit} px")]
    TooManyPixels { width: u32, height: u32, limit: u32 },
}

impl Refusal {
    /// Low-cardinality name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::InvalidBase64 => "invalid_base64",
            Refusal::Empty => "empty",
            Refusal::TooLarge { .. } => "too_large",
            Refusal::Unsupported => "unsupported_type",
            Refusal::Damaged => "damaged",
            Refusal::TooManyPixels { .. } => "too_many_pixels",
        }
    }
}

/// An image whose bytes were checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub kind: ImageType,
    pub width: u32,
    pub height: u32,
    pub bytes: Bytes,
    /// The label it came with named another type (or none); the bytes decided.
    pub relabelled: bool,
}

impl Checked {
    pub fn long_edge(&self) -> u32 {
        self.width.max(self.height)
    }

    /// Length of the bytes in base64, as Anthropic measures an image (SPEC section 9).
    pub fn base64_len(&self) -> u64 {
        (self.bytes.len() as u64).div_ceil(3) * 4
    }
}

/// Decodes strict base64 (standard alphabet, padded, no whitespace), refusing without
/// allocating when the decoded size would pass `max_bytes`.
pub fn decode_base64(data: &str, max_bytes: u64) -> Result<Vec<u8>, Refusal> {
    let estimate = (data.len() as u64) / 4 * 3;
    if estimate > max_bytes.saturating_add(3) {
        return Err(Refusal::TooLarge {
            bytes: estimate,
            limit: max_bytes,
        });
    }
    // SIMD: a screenshot's megabyte of base64 decodes in a fraction of the scalar time. It
    // accepts exactly what the strict scalar decoder accepts (a property test holds the two
    // equal).
    let bytes = base64_simd::STANDARD
        .decode_to_vec(data.as_bytes())
        .map_err(|_| Refusal::InvalidBase64)?;
    if bytes.len() as u64 > max_bytes {
        return Err(Refusal::TooLarge {
            bytes: bytes.len() as u64,
            limit: max_bytes,
        });
    }
    Ok(bytes)
}

/// The width and height of an image, read from its header: `head` may be the file's first
/// bytes only. `None` when it is not an image sluice can read.
pub fn header_size(head: &[u8]) -> Option<(u32, u32)> {
    let kind = ImageType::from_format(image::guess_format(head).ok()?)?;
    let mut reader = ImageReader::with_format(Cursor::new(head), kind.format());
    reader.limits(limits());
    reader.into_dimensions().ok()
}

/// The image type the first bytes of a file announce, if any of the four.
pub fn sniff(head: &[u8]) -> Option<ImageType> {
    ImageType::from_format(image::guess_format(head).ok()?)
}

/// Checks image bytes: the type from the magic bytes, the size from the header, and that the
/// file ends as its format requires. `declared` is the type the image was labelled with.
pub fn check(bytes: Bytes, declared: Option<&str>) -> Result<Checked, Refusal> {
    if bytes.is_empty() {
        return Err(Refusal::Empty);
    }
    let kind = image::guess_format(&bytes)
        .ok()
        .and_then(ImageType::from_format)
        .ok_or(Refusal::Unsupported)?;
    let mut reader = ImageReader::with_format(Cursor::new(&bytes[..]), kind.format());
    reader.limits(limits());
    let (width, height) = reader.into_dimensions().map_err(|_| Refusal::Damaged)?;
    if width == 0 || height == 0 || !complete(kind, &bytes) {
        return Err(Refusal::Damaged);
    }
    let relabelled = declared.is_none_or(|d| !d.trim().eq_ignore_ascii_case(kind.mime()));
    Ok(Checked {
        kind,
        width,
        height,
        bytes,
        relabelled,
    })
}

fn limits() -> Limits {
    let mut limits = Limits::default();
    limits.max_alloc = Some(MAX_DECODE_ALLOC);
    limits
}

/// Whether the file ends as its format requires: a truncated upload is caught here without
/// decoding it (providers refuse damaged images, and would fail the whole request).
fn complete(kind: ImageType, bytes: &[u8]) -> bool {
    match kind {
        // The last chunk is IEND: length 0, type "IEND", CRC.
        ImageType::Png => bytes.len() >= 12 && &bytes[bytes.len() - 8..bytes.len() - 4] == b"IEND",
        // End-of-image marker, possibly followed by padding some encoders add.
        ImageType::Jpeg => bytes.windows(2).rev().take(64).any(|w| w == [0xFF, 0xD9]),
        // The trailer byte.
        ImageType::Gif => bytes.last() == Some(&0x3B),
        // The RIFF header's size covers the whole file.
        ImageType::Webp => {
            bytes.len() >= 12
                && u64::from(u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]])) + 8
                    <= bytes.len() as u64
        }
    }
}

/// Resizes `image` so its long edge is at most `max_dimension` and its bytes at most
/// `max_bytes`, keeping the aspect ratio. Deterministic: a fixed filter and fixed encoder
/// settings, so the same input and limits always give the same bytes (SPEC A6). PNG and GIF
/// become PNG (lossless); JPEG and WebP become JPEG at quality 85.
pub fn downscale(image: &Checked, max_dimension: u32, max_bytes: u64) -> Result<Checked, Refusal> {
    let pixels = u64::from(image.width) * u64::from(image.height);
    if pixels > MAX_DECODE_PIXELS {
        return Err(Refusal::TooManyPixels {
            width: image.width,
            height: image.height,
            limit: max_dimension,
        });
    }
    let mut reader = ImageReader::with_format(Cursor::new(&image.bytes[..]), image.kind.format());
    reader.limits(limits());
    let decoded = reader.decode().map_err(|_| Refusal::Damaged)?;
    let (out_kind, format) = match image.kind {
        ImageType::Png | ImageType::Gif => (ImageType::Png, ImageFormat::Png),
        ImageType::Jpeg | ImageType::Webp => (ImageType::Jpeg, ImageFormat::Jpeg),
    };
    let mut edge = image.long_edge().min(max_dimension.max(1));
    loop {
        let scale = f64::from(edge) / f64::from(image.long_edge());
        let w = ((f64::from(image.width) * scale).round() as u32).max(1);
        let h = ((f64::from(image.height) * scale).round() as u32).max(1);
        let resized = decoded.resize_exact(w, h, image::imageops::FilterType::Triangle);
        let mut out = Vec::new();
        match format {
            ImageFormat::Jpeg => {
                let encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 85);
                resized.to_rgb8().write_with_encoder(encoder)
            }
            _ => resized.write_to(&mut Cursor::new(&mut out), format),
        }
        .map_err(|_| Refusal::Damaged)?;
        let candidate = Checked {
            kind: out_kind,
            width: w,
            height: h,
            bytes: Bytes::from(out),
            relabelled: false,
        };
        if candidate.base64_len() <= max_bytes || edge <= 64 {
            return if candidate.base64_len() <= max_bytes {
                Ok(candidate)
            } else {
                Err(Refusal::TooLarge {
                    bytes: candidate.base64_len(),
                    limit: max_bytes,
                })
            };
        }
        // Too many bytes still: shrink the long edge by a fixed step and try again.
        edge = edge * 3 / 4;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use image::{DynamicImage, RgbImage};

    /// A test picture of `w`×`h` with some structure (so compression has work to do).
    pub(crate) fn picture(w: u32, h: u32) -> DynamicImage {
        DynamicImage::ImageRgb8(RgbImage::from_fn(w, h, |x, y| {
            image::Rgb([(x % 256) as u8, (y % 256) as u8, ((x * y) % 251) as u8])
        }))
    }

    pub(crate) fn encode(img: &DynamicImage, format: ImageFormat) -> Bytes {
        let mut out = Vec::new();
        match format {
            ImageFormat::WebP => {
                let enc = image::codecs::webp::WebPEncoder::new_lossless(&mut out);
                img.to_rgba8().write_with_encoder(enc).unwrap();
            }
            ImageFormat::Gif | ImageFormat::Jpeg => img
                .to_rgb8()
                .write_to(&mut Cursor::new(&mut out), format)
                .unwrap(),
            _ => img.write_to(&mut Cursor::new(&mut out), format).unwrap(),
        }
        Bytes::from(out)
    }

    #[test]
    fn real_images_of_each_type_are_read_from_their_bytes() {
        let img = picture(64, 40);
        for (format, kind) in [
            (ImageFormat::Png, ImageType::Png),
            (ImageFormat::Jpeg, ImageType::Jpeg),
            (ImageFormat::Gif, ImageType::Gif),
            (ImageFormat::WebP, ImageType::Webp),
        ] {
            let checked = check(encode(&img, format), Some(kind.mime())).unwrap();
            assert_eq!(
                (checked.kind, checked.width, checked.height),
                (kind, 64, 40),
                "{format:?}"
            );
            assert!(!checked.relabelled);
        }
    }

    #[test]
    fn a_mislabelled_image_is_relabelled_by_its_bytes() {
        let png = encode(&picture(10, 10), ImageFormat::Png);
        let checked = check(png, Some("image/jpeg")).unwrap();
        assert_eq!(checked.kind, ImageType::Png);
        assert!(checked.relabelled);
    }

    #[test]
    fn bad_bytes_are_refused_with_a_reason() {
        let png = encode(&picture(32, 32), ImageFormat::Png);
        let jpeg = encode(&picture(32, 32), ImageFormat::Jpeg);
        let gif = encode(&picture(32, 32), ImageFormat::Gif);
        assert_eq!(check(Bytes::new(), None), Err(Refusal::Empty));
        assert_eq!(
            check(Bytes::from_static(b"hello, not an image"), None),
            Err(Refusal::Unsupported)
        );
        assert_eq!(
            check(Bytes::from_static(b"%PDF-1.7\n"), Some("image/png")),
            Err(Refusal::Unsupported)
        );
        for truncated in [
            png.slice(..png.len() / 2),
            jpeg.slice(..jpeg.len() - 10),
            gif.slice(..gif.len() - 1),
            png.slice(..20),
        ] {
            assert_eq!(check(truncated, None), Err(Refusal::Damaged));
        }
    }

    #[test]
    fn a_decompression_bomb_header_is_refused_without_decoding() {
        // A valid PNG header claiming 100,000 × 100,000 pixels, with a tiny body.
        let mut png = Vec::new();
        png.extend_from_slice(b"\x89PNG\r\n\x1a\n");
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&100_000u32.to_be_bytes());
        ihdr.extend_from_slice(&100_000u32.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        chunk(&mut png, b"IHDR", &ihdr);
        chunk(
            &mut png,
            b"IDAT",
            &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
        );
        chunk(&mut png, b"IEND", &[]);
        let start = std::time::Instant::now();
        let checked = check(Bytes::from(png), None).unwrap();
        assert_eq!((checked.width, checked.height), (100_000, 100_000));
        assert!(
            start.elapsed() < std::time::Duration::from_millis(50),
            "header only"
        );
        assert!(matches!(
            downscale(&checked, 2000, 5 << 20),
            Err(Refusal::TooManyPixels { .. })
        ));
    }

    fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        let mut crc = crc32(kind);
        crc = crc32_update(crc, data);
        out.extend_from_slice(&(!crc).to_be_bytes());
    }

    fn crc32(data: &[u8]) -> u32 {
        crc32_update(0xFFFF_FFFF, data)
    }

    fn crc32_update(mut crc: u32, data: &[u8]) -> u32 {
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        crc
    }

    proptest::proptest! {
        /// The SIMD decoder accepts and refuses what the scalar strict one (base64's STANDARD:
        /// padded, canonical last symbol, no whitespace) does, and decodes to the same bytes.
        #[test]
        fn simd_base64_decodes_as_the_strict_scalar_decoder(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            edits in proptest::collection::vec((proptest::prelude::any::<proptest::sample::Index>(), proptest::sample::select(b"A/+=z9 -\n_\x80".to_vec())), 0..3),
            cut in 0usize..4,
        ) {
            let mut text = STANDARD.encode(&bytes).into_bytes();
            for (at, byte) in edits {
                if !text.is_empty() {
                    let i = at.index(text.len());
                    text[i] = byte;
                }
            }
            text.truncate(text.len().saturating_sub(cut));
            let Ok(text) = String::from_utf8(text) else { return Ok(()) };
            let scalar = STANDARD.decode(text.as_bytes()).map_err(|_| Refusal::InvalidBase64);
            proptest::prop_assert_eq!(decode_base64(&text, 1 << 20), scalar);
        }
    }

    #[test]
    fn strict_base64_with_a_size_cap() {
        assert_eq!(decode_base64("aGVsbG8=", 100).unwrap(), b"hello");
        assert_eq!(
            decode_base64("aGVsbG8", 100),
            Err(Refusal::InvalidBase64),
            "padding required"
        );
        assert_eq!(decode_base64("aGVs bG8=", 100), Err(Refusal::InvalidBase64));
        // Bits left over in the last symbol: not canonical, refused as the scalar decoder does.
        assert_eq!(decode_base64("aGVsbG9=", 100), Err(Refusal::InvalidBase64));
        assert_eq!(decode_base64("aGVsbA==", 100).unwrap(), b"hell");
        assert_eq!(decode_base64("aGVsbB==", 100), Err(Refusal::InvalidBase64));
        assert_eq!(decode_base64("!!!!", 100), Err(Refusal::InvalidBase64));
        assert!(matches!(
            decode_base64(&"A".repeat(4000), 100),
            Err(Refusal::TooLarge { .. })
        ));
    }

    #[test]
    fn downscale_fits_the_limits_and_is_deterministic() {
        let jpeg = check(
            encode(&picture(1200, 800), ImageFormat::Jpeg),
            Some("image/jpeg"),
        )
        .unwrap();
        let a = downscale(&jpeg, 300, 5 << 20).unwrap();
        let b = downscale(&jpeg, 300, 5 << 20).unwrap();
        assert_eq!((a.width, a.height), (300, 200));
        assert_eq!(a.bytes, b.bytes, "same input and policy, same bytes");
        assert_eq!(
            check(a.bytes.clone(), Some("image/jpeg")).unwrap().width,
            300
        );
        let png = check(encode(&picture(1000, 1000), ImageFormat::Png), None).unwrap();
        let small = downscale(&png, 1000, 40_000).unwrap();
        assert!(small.base64_len() <= 40_000);
        assert_eq!(small.kind, ImageType::Png);
        assert_eq!(small.width, small.height, "aspect kept");
    }
}
