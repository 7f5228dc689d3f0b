//! Content addressing (SPEC section 1, S3, T7, M4): an artifact's name is its kind and a digest
//! of tenant and content, so the same bytes are one artifact per tenant on every replica, and a
//! name reveals neither.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use sha2::{Digest, Sha256};

use crate::tenant::Tenant;

/// What an artifact holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArtifactKind {
    /// UTF-8 text (a spilled tool result).
    Text,
    /// Image bytes (their type is read from the bytes).
    Media,
}

/// An artifact's name: its kind and a digest of tenant and content (S3: it reveals neither).
/// Written `t…` or `m…` plus 32 URL-safe base64 characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArtifactId {
    pub kind: ArtifactKind,
    digest: [u8; 24],
}

pub const ARTIFACT_ID_LEN: usize = 33;

impl ArtifactId {
    /// The id of `content` stored by `tenant`: the same bytes under two tenants are two
    /// artifacts; the same bytes under one tenant are one, on every replica (T7, M4).
    pub fn for_content(tenant: &Tenant, kind: ArtifactKind, content: &[u8]) -> ArtifactId {
        let mut h = Sha256::new();
        h.update(tenant.key());
        h.update(match kind {
            ArtifactKind::Text => b"text\0",
            ArtifactKind::Media => b"media",
        });
        h.update(content);
        let full = h.finalize();
        let mut digest = [0u8; 24];
        digest.copy_from_slice(&full[..24]);
        ArtifactId { kind, digest }
    }

    pub fn digest(&self) -> &[u8; 24] {
        &self.digest
    }

    pub fn from_parts(kind: ArtifactKind, digest: [u8; 24]) -> ArtifactId {
        ArtifactId { kind, digest }
    }

    /// Parses the written form; `None` for anything that is not exactly an id.
    pub fn parse(s: &str) -> Option<ArtifactId> {
        if s.len() != ARTIFACT_ID_LEN {
            return None;
        }
        let kind = match s.as_bytes()[0] {
            b't' => ArtifactKind::Text,
            b'm' => ArtifactKind::Media,
            _ => return None,
        };
        let bytes = URL_SAFE_NO_PAD.decode(&s[1..]).ok()?;
        let digest: [u8; 24] = bytes.try_into().ok()?;
        Some(ArtifactId { kind, digest })
    }
}

impl std::fmt::Display for ArtifactId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let prefix = match self.kind {
            ArtifactKind::Text => 't',
            ArtifactKind::Media => 'm',
        };
        write!(f, "{prefix}{}", URL_SAFE_NO_PAD.encode(self.digest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_url_safe_tenant_scoped_and_round_trip() {
        let a = Tenant::from_credential(b"a");
        let b = Tenant::from_credential(b"b");
        let id = ArtifactId::for_content(&a, ArtifactKind::Text, b"hello");
        let s = id.to_string();
        assert_eq!(s.len(), ARTIFACT_ID_LEN);
        assert!(s.starts_with('t'));
        assert!(s
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
        assert_eq!(ArtifactId::parse(&s), Some(id));
        assert_eq!(
            id,
            ArtifactId::for_content(&a, ArtifactKind::Text, b"hello")
        );
        assert_ne!(
            id,
            ArtifactId::for_content(&b, ArtifactKind::Text, b"hello")
        );
        assert_ne!(
            id,
            ArtifactId::for_content(&a, ArtifactKind::Media, b"hello")
        );
        for bad in [
            "",
            "x",
            &s[1..],
            &format!("x{}", &s[1..]),
            &format!("{s}A"),
            "t../../../etc/passwd_______________",
        ] {
            assert_eq!(ArtifactId::parse(bad), None, "{bad}");
        }
    }
}
