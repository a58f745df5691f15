//! Where a request carries its key.

use axum::http::{header, HeaderMap};

/// The key in `Authorization: Bearer <key>` (scheme case-insensitive), else
/// in `x-api-key` (Anthropic-style clients). Empty values count as absent.
pub fn presented_key(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        });
    let plain = || {
        headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    bearer
        .filter(|k| !k.is_empty())
        .or_else(|| plain().filter(|k| !k.is_empty()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn bearer_then_x_api_key() {
        assert_eq!(
            presented_key(&headers(&[("authorization", "Bearer sk-1")])),
            Some("sk-1")
        );
        assert_eq!(
            presented_key(&headers(&[("authorization", "bearer  sk-1 ")])),
            Some("sk-1")
        );
        assert_eq!(
            presented_key(&headers(&[("x-api-key", "sk-2")])),
            Some("sk-2")
        );
        let both = headers(&[("authorization", "Bearer sk-1"), ("x-api-key", "sk-2")]);
        assert_eq!(presented_key(&both), Some("sk-1"));
    }

    #[test]
    fn other_schemes_and_empty_values_are_absent() {
        assert_eq!(
            presented_key(&headers(&[("authorization", "Basic dXNlcjpw")])),
            None
        );
        assert_eq!(
            presented_key(&headers(&[("authorization", "Bearer ")])),
            None
        );
        assert_eq!(presented_key(&headers(&[("authorization", "sk-1")])), None);
        assert_eq!(presented_key(&headers(&[("x-api-key", "")])), None);
        assert_eq!(presented_key(&HeaderMap::new()), None);
        let fallback = headers(&[("authorization", "Basic x"), ("x-api-key", "sk-2")]);
        assert_eq!(presented_key(&fallback), Some("sk-2"));
    }
}
