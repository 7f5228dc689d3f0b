//! Continue cursors (SPEC T5, T8): where to read on in a text artifact. A cursor names the
//! artifact, the range (to its last line), the position and the page budget, and carries a MAC
//! keyed by the tenant: opaque, tamper-evident, useless to another tenant. It holds no time or
//! counter, so the same page always carries the same cursor (T7). Fixed length.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::text::{Budget, Position};
use crate::projection::artifact::{ArtifactId, ArtifactKind};
use crate::tenant::Tenant;

const VERSION: u8 = 1;
/// version + digest + line + unit + end line + budget lines + budget units
const PAYLOAD_LEN: usize = 1 + 24 + 4 * 5;
const MAC_LEN: usize = 16;
/// Length of a written cursor.
pub const CURSOR_LEN: usize = (PAYLOAD_LEN + MAC_LEN) * 4 / 3 + 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub artifact: ArtifactId,
    pub at: Position,
    /// One past the last line of the range being read.
    pub end_line: u32,
    pub budget: Budget,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CursorError {
    #[error("the cursor is malformed")]
    Malformed,
    /// Forged, altered, or made for another tenant: indistinguishable, on purpose.
    #[error("no such cursor")]
    Foreign,
}

fn mac(tenant: &Tenant) -> Hmac<Sha256> {
    // HMAC takes keys of any length; this cannot fail.
    <Hmac<Sha256> as Mac>::new_from_slice(tenant.key()).unwrap_or_else(|_| unreachable!())
}

fn u32_of(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Cursor {
    /// Whether the cursor reads `lines`: the range it records ends where the text does, and
    /// its position lies within (T5). Artifacts are content-addressed, so only a store that
    /// lost or altered bytes makes this false.
    pub fn reads(&self, lines: &super::text::Lines<'_>) -> bool {
        self.reads_lines(lines.count())
    }

    /// [`Cursor::reads`] for a text of `count` lines.
    pub fn reads_lines(&self, count: usize) -> bool {
        usize::try_from(self.end_line).is_ok_and(|end| end == count)
            && self.at.line <= self.end_line
    }

    pub fn encode(&self, tenant: &Tenant) -> String {
        let mut out = Vec::with_capacity(PAYLOAD_LEN + MAC_LEN);
        out.push(VERSION);
        out.extend_from_slice(self.artifact.digest());
        for n in [
            self.at.line,
            self.at.unit,
            self.end_line,
            u32_of(self.budget.lines),
            u32_of(self.budget.units),
        ] {
            out.extend_from_slice(&n.to_be_bytes());
        }
        let mut m = mac(tenant);
        m.update(&out);
        let tag = m.finalize().into_bytes();
        out.extend_from_slice(&tag[..MAC_LEN]);
        URL_SAFE_NO_PAD.encode(out)
    }

    pub fn decode(s: &str, tenant: &Tenant) -> Result<Cursor, CursorError> {
        if s.len() != CURSOR_LEN {
            return Err(CursorError::Malformed);
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|_| CursorError::Malformed)?;
        if bytes.len() != PAYLOAD_LEN + MAC_LEN || bytes[0] != VERSION {
            return Err(CursorError::Malformed);
        }
        let (payload, tag) = bytes.split_at(PAYLOAD_LEN);
        let mut m = mac(tenant);
        m.update(payload);
        m.verify_truncated_left(tag)
            .map_err(|_| CursorError::Foreign)?;
        let mut digest = [0u8; 24];
        digest.copy_from_slice(&payload[1..25]);
        let n = |i: usize| {
            let at = 25 + 4 * i;
            u32::from_be_bytes([
                payload[at],
                payload[at + 1],
                payload[at + 2],
                payload[at + 3],
            ])
        };
        Ok(Cursor {
            artifact: ArtifactId::from_parts(ArtifactKind::Text, digest),
            at: Position {
                line: n(0),
                unit: n(1),
            },
            end_line: n(2),
            budget: Budget {
                lines: n(3) as usize,
                units: n(4) as usize,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::exit::text::Lines;

    #[test]
    fn a_cursor_reads_only_the_text_of_its_recorded_range_t5() {
        let t = Tenant::from_credential(b"k");
        let text = "a\nb\nc";
        let lines = Lines::new(text);
        let c = Cursor {
            artifact: ArtifactId::for_content(&t, ArtifactKind::Text, text.as_bytes()),
            at: Position { line: 1, unit: 0 },
            end_line: u32::try_from(lines.count()).unwrap(),
            budget: Budget {
                lines: 1,
                units: 10,
            },
        };
        assert!(c.reads(&lines));
        assert!(!c.reads(&Lines::new("a\nb")), "a shorter text");
        assert!(!c.reads(&Lines::new("a\nb\nc\nd")), "a longer text");
        let past = Cursor {
            at: Position { line: 9, unit: 0 },
            ..c
        };
        assert!(!past.reads(&lines), "a position past the range");
    }

    fn cursor() -> (Tenant, Cursor) {
        let t = Tenant::from_credential(b"k");
        let c = Cursor {
            artifact: ArtifactId::for_content(&t, ArtifactKind::Text, b"x"),
            at: Position { line: 7, unit: 3 },
            end_line: 99,
            budget: Budget {
                lines: 2000,
                units: 30_000,
            },
        };
        (t, c)
    }

    #[test]
    fn round_trips_with_a_fixed_length() {
        let (t, c) = cursor();
        let s = c.encode(&t);
        assert_eq!(s.len(), CURSOR_LEN);
        assert!(s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(Cursor::decode(&s, &t), Ok(c));
        assert_eq!(s, c.encode(&t), "deterministic (T7)");
    }

    #[test]
    fn foreign_altered_and_malformed_cursors_are_refused() {
        let (t, c) = cursor();
        let s = c.encode(&t);
        let other = Tenant::from_credential(b"other");
        assert_eq!(Cursor::decode(&s, &other), Err(CursorError::Foreign));
        let mut bytes = URL_SAFE_NO_PAD.decode(&s).unwrap();
        bytes[30] ^= 1; // move the position
        let altered = URL_SAFE_NO_PAD.encode(&bytes);
        assert_eq!(Cursor::decode(&altered, &t), Err(CursorError::Foreign));
        for bad in [
            "",
            "abc",
            &s[1..],
            &format!("{s}x"),
            &"!".repeat(CURSOR_LEN),
        ] {
            assert_eq!(
                Cursor::decode(bad, &t),
                Err(CursorError::Malformed),
                "{bad}"
            );
        }
    }
}
