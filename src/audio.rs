//! Audio checks (issue #17, docs/audio.md): the container sniffed from the bytes' magic
//! numbers, its label compared, a WAV's duration read from its header, a size cap. Pure and
//! panic-free, like [`crate::image`].

use bytes::Bytes;

/// The most decoded bytes an audio item may have: OpenAI's limit for an audio file, 25 MB.
pub const MAX_AUDIO_BYTES: u64 = 25 * 1000 * 1000;

/// The containers sluice recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AudioType {
    Wav,
    Mp3,
    Ogg,
    Flac,
    Webm,
    Mp4,
}

impl AudioType {
    pub fn mime(self) -> &'static str {
        match self {
            AudioType::Wav => "audio/wav",
            AudioType::Mp3 => "audio/mpeg",
            AudioType::Ogg => "audio/ogg",
            AudioType::Flac => "audio/flac",
            AudioType::Webm => "audio/webm",
            AudioType::Mp4 => "audio/mp4",
        }
    }

    /// The short name shown in references.
    pub fn name(self) -> &'static str {
        match self {
            AudioType::Wav => "WAV",
            AudioType::Mp3 => "MP3",
            AudioType::Ogg => "Ogg",
            AudioType::Flac => "FLAC",
            AudioType::Webm => "WebM",
            AudioType::Mp4 => "MP4",
        }
    }

    /// The `format` OpenAI chat's `input_audio` part names it by (WIRE.md: `wav` or `mp3`);
    /// `None` for a container no provider takes as input.
    pub fn input_format(self) -> Option<&'static str> {
        match self {
            AudioType::Wav => Some("wav"),
            AudioType::Mp3 => Some("mp3"),
            _ => None,
        }
    }

    /// The type whose media type [`AudioType::mime`] is `mime`.
    pub fn of_mime(mime: &str) -> Option<AudioType> {
        use AudioType::*;
        [Wav, Mp3, Ogg, Flac, Webm, Mp4]
            .into_iter()
            .find(|t| t.mime() == mime)
    }

    /// The type from the first bytes of a file.
    pub fn sniff(bytes: &[u8]) -> Option<AudioType> {
        let at = |from: usize, magic: &[u8]| bytes.get(from..from + magic.len()) == Some(magic);
        if at(0, b"RIFF") && at(8, b"WAVE") {
            Some(AudioType::Wav)
        } else if at(0, b"ID3") || (bytes.len() >= 2 && bytes[0] == 0xFF && bytes[1] & 0xE0 == 0xE0)
        {
            Some(AudioType::Mp3)
        } else if at(0, b"OggS") {
            Some(AudioType::Ogg)
        } else if at(0, b"fLaC") {
            Some(AudioType::Flac)
        } else if at(0, &[0x1A, 0x45, 0xDF, 0xA3]) {
            Some(AudioType::Webm)
        } else if at(4, b"ftyp") {
            Some(AudioType::Mp4)
        } else {
            None
        }
    }

    /// Whether a declared media type names this container (the common aliases included).
    fn answers_to(self, declared: &str) -> bool {
        let declared = declared.trim().to_ascii_lowercase();
        let declared = declared.split(';').next().unwrap_or_default();
        match self {
            AudioType::Wav => matches!(
                declared,
                "audio/wav" | "audio/x-wav" | "audio/wave" | "audio/vnd.wave"
            ),
            AudioType::Mp3 => matches!(
                declared,
                "audio/mpeg" | "audio/mp3" | "audio/mpeg3" | "audio/x-mpeg-3"
            ),
            AudioType::Ogg => matches!(declared, "audio/ogg" | "audio/opus" | "audio/vorbis"),
            AudioType::Flac => matches!(declared, "audio/flac" | "audio/x-flac"),
            AudioType::Webm => declared == "audio/webm",
            AudioType::Mp4 => matches!(
                declared,
                "audio/mp4" | "audio/m4a" | "audio/x-m4a" | "audio/aac"
            ),
        }
    }
}

/// Why an audio item cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AudioRefusal {
    #[error("the audio data is not valid base64")]
    InvalidBase64,
    #[error("the audio is empty")]
    Empty,
    #[error("the audio data is {bytes} bytes, over the limit of {limit}")]
    TooLarge { bytes: u64, limit: u64 },
    #[error("the data is not a WAV, MP3, Ogg, FLAC, WebM or MP4 audio file")]
    Unsupported,
    #[error("the file is labelled {declared} but is {actual}")]
    Mislabelled {
        declared: String,
        actual: &'static str,
    },
    #[error("the audio file is damaged or incomplete")]
    Damaged,
}

impl AudioRefusal {
    /// Low-cardinality name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            AudioRefusal::InvalidBase64 => "invalid_base64",
            AudioRefusal::Empty => "empty",
            AudioRefusal::TooLarge { .. } => "too_large",
            AudioRefusal::Unsupported => "unsupported_type",
            AudioRefusal::Mislabelled { .. } => "mislabelled",
            AudioRefusal::Damaged => "damaged",
        }
    }
}

/// Audio whose bytes were checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedAudio {
    pub kind: AudioType,
    pub bytes: Bytes,
    /// Its length in milliseconds, where the header says it cheaply (WAV).
    pub millis: Option<u64>,
}

/// Decodes base64 audio and checks it; the size is bounded before decoding, as an image's is.
pub fn from_base64(data: &str, declared: Option<&str>) -> Result<CheckedAudio, AudioRefusal> {
    let bytes =
        crate::image::decode_base64(data.trim(), MAX_AUDIO_BYTES).map_err(
            |refusal| match refusal {
                crate::image::Refusal::TooLarge { bytes, limit } => {
                    AudioRefusal::TooLarge { bytes, limit }
                }
                _ => AudioRefusal::InvalidBase64,
            },
        )?;
    check(Bytes::from(bytes), declared)
}

/// Checks audio bytes: a known container, labelled as what it is, whole (a WAV's RIFF size
/// covers the file), within [`MAX_AUDIO_BYTES`].
pub fn check(bytes: Bytes, declared: Option<&str>) -> Result<CheckedAudio, AudioRefusal> {
    if bytes.is_empty() {
        return Err(AudioRefusal::Empty);
    }
    if bytes.len() as u64 > MAX_AUDIO_BYTES {
        return Err(AudioRefusal::TooLarge {
            bytes: bytes.len() as u64,
            limit: MAX_AUDIO_BYTES,
        });
    }
    let kind = AudioType::sniff(&bytes).ok_or(AudioRefusal::Unsupported)?;
    if let Some(declared) = declared.filter(|d| !d.trim().is_empty()) {
        if !kind.answers_to(declared) {
            return Err(AudioRefusal::Mislabelled {
                declared: declared.chars().take(64).collect(),
                actual: kind.name(),
            });
        }
    }
    let millis = match kind {
        AudioType::Wav => Some(wav_millis(&bytes).ok_or(AudioRefusal::Damaged)?),
        _ => None,
    };
    Ok(CheckedAudio {
        kind,
        bytes,
        millis,
    })
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at + 4)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// A WAV's duration: its `data` chunk's size over the `fmt ` chunk's byte rate. `None` when the
/// file is cut short of its RIFF size or either chunk is missing.
fn wav_millis(bytes: &[u8]) -> Option<u64> {
    let riff = u64::from(u32_at(bytes, 4)?);
    if riff + 8 > bytes.len() as u64 {
        return None;
    }
    header_millis(bytes)
}

/// An audio file's length as its first bytes declare it (a WAV's header; `None` for other
/// containers, or a header cut short), without checking that the rest of the file is there:
/// for estimates of a file whose head alone was decoded (the inspector's token counts).
pub fn header_millis(head: &[u8]) -> Option<u64> {
    if AudioType::sniff(head)? != AudioType::Wav {
        return None;
    }
    let (mut at, mut rate, mut data) = (12usize, None, None);
    while at + 8 <= head.len() && (rate.is_none() || data.is_none()) {
        let id = head.get(at..at + 4)?;
        let size = u32_at(head, at + 4)? as usize;
        match id {
            b"fmt " => rate = u32_at(head, at + 16),
            b"data" => data = Some(size as u64),
            _ => {}
        }
        at = at.checked_add(8 + size + size % 2)?;
    }
    let rate = u64::from(rate.filter(|r| *r > 0)?);
    Some(data? * 1000 / rate)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A mono 16-bit 8 kHz WAV of `millis` milliseconds of silence.
    pub fn wav(millis: u32) -> Vec<u8> {
        let data = 16 * millis; // 8000 samples/s × 2 bytes = 16 bytes a millisecond
        let mut out = Vec::new();
        out.extend_from_slice(b"RIFF");
        out.extend_from_slice(&(36 + data).to_le_bytes());
        out.extend_from_slice(b"WAVEfmt ");
        out.extend_from_slice(&16u32.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes()); // PCM
        out.extend_from_slice(&1u16.to_le_bytes()); // mono
        out.extend_from_slice(&8000u32.to_le_bytes());
        out.extend_from_slice(&16000u32.to_le_bytes()); // byte rate
        out.extend_from_slice(&2u16.to_le_bytes());
        out.extend_from_slice(&16u16.to_le_bytes());
        out.extend_from_slice(b"data");
        out.extend_from_slice(&data.to_le_bytes());
        out.resize(out.len() + data as usize, 0);
        out
    }

    #[test]
    fn a_wav_is_recognised_with_its_duration() {
        let audio = check(Bytes::from(wav(1500)), Some("audio/wav")).unwrap();
        assert_eq!((audio.kind, audio.millis), (AudioType::Wav, Some(1500)));
        assert_eq!(
            check(Bytes::from(wav(10)), Some("audio/x-wav"))
                .unwrap()
                .kind,
            AudioType::Wav
        );
        assert_eq!(
            check(Bytes::from(wav(10)), None).unwrap().kind,
            AudioType::Wav
        );
    }

    #[test]
    fn a_wav_header_alone_gives_its_length() {
        let whole = wav(2500);
        assert_eq!(header_millis(&whole[..64]), Some(2500));
        assert_eq!(header_millis(&whole[..20]), None, "cut inside the header");
        assert_eq!(header_millis(b"ID3\x04\x00\x00 an mp3"), None);
    }

    #[test]
    fn truncated_mislabelled_unknown_and_empty_files_are_refused() {
        let mut cut = wav(1000);
        cut.truncate(cut.len() / 2);
        assert_eq!(
            check(Bytes::from(cut), Some("audio/wav")),
            Err(AudioRefusal::Damaged)
        );
        let refused = check(Bytes::from(wav(10)), Some("audio/mpeg")).unwrap_err();
        assert_eq!(refused.reason(), "mislabelled");
        assert!(refused.to_string().contains("audio/mpeg") && refused.to_string().contains("WAV"));
        assert_eq!(
            check(Bytes::from_static(b"hello"), None),
            Err(AudioRefusal::Unsupported)
        );
        assert_eq!(check(Bytes::new(), None), Err(AudioRefusal::Empty));
        assert_eq!(
            from_base64("not base64!", None),
            Err(AudioRefusal::InvalidBase64)
        );
        let mp3 = [b"ID3\x04\x00\x00".as_slice(), &[0u8; 32]].concat();
        assert_eq!(
            check(Bytes::from(mp3), Some("audio/mpeg")).unwrap().kind,
            AudioType::Mp3
        );
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_are_checked_without_panicking(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = check(Bytes::from(bytes.clone()), Some("audio/wav"));
            let mut riff = b"RIFF\xff\xff\xff\x7fWAVE".to_vec();
            riff.extend(bytes);
            let _ = check(Bytes::from(riff), None);
        }
    }
}
