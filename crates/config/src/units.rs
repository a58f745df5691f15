//! Values with units: [`Duration`] and [`ByteSize`].
//!
//! Config files are written by people, so times and sizes are written the way
//! people say them ("30s", "250ms", "4MiB"); plain numbers still work (seconds,
//! bytes) so a script can pass `INGOT_CACHE_TTL=600`. Both serialize back to an
//! exact human string, so `ingot config show` output loads back unchanged.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A span of time: "30s", "250ms", "2m", "1h 30m" (humantime syntax), or a
/// plain number of seconds (`30`, `0.25`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(std::time::Duration);

impl Duration {
    /// `secs` whole seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Self(std::time::Duration::from_secs(secs))
    }

    /// `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        Self(std::time::Duration::from_millis(ms))
    }

    /// The standard library value.
    pub const fn get(self) -> std::time::Duration {
        self.0
    }
}

impl From<std::time::Duration> for Duration {
    fn from(d: std::time::Duration) -> Self {
        Self(d)
    }
}

impl FromStr for Duration {
    type Err = String;

    /// A bare number is seconds; anything else goes to humantime.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Ok(secs) = s.parse::<f64>() {
            return seconds(secs);
        }
        humantime::parse_duration(s)
            .map(Self)
            .map_err(|e| format!("expected a duration like \"30s\" or \"250ms\": {e}"))
    }
}

/// Seconds as a number: non-negative and finite.
fn seconds(secs: f64) -> Result<Duration, String> {
    std::time::Duration::try_from_secs_f64(secs)
        .map(Duration)
        .map_err(|_| format!("expected a non-negative number of seconds, got {secs}"))
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DurationVisitor)
    }
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration like \"30s\" or \"250ms\", or a number of seconds")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
        v.parse().map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
        Ok(Duration::from_secs(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
        seconds(v as f64).map_err(E::custom)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
        seconds(v).map_err(E::custom)
    }
}

/// The string forms humantime accepts: number-unit pairs, or a bare number.
const DURATION_PATTERN: &str = r"^\s*(([0-9]+(\.[0-9]+)?\s*[a-zA-Zµ]+\s*)+|[0-9]+(\.[0-9]+)?)$";

impl JsonSchema for Duration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A duration: \"30s\", \"250ms\", \"2m\", \"1h 30m\", or a number of seconds.",
            "anyOf": [
                { "type": "string", "pattern": DURATION_PATTERN },
                { "type": "number", "minimum": 0 }
            ]
        })
    }
}

/// A size in bytes: "4MiB", "8GiB", "512KB" (KB, MB, GB are powers of 1000;
/// KiB, MiB, GiB of 1024), or a plain number of bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(u64);

impl ByteSize {
    /// `n` bytes.
    pub const fn from_bytes(n: u64) -> Self {
        Self(n)
    }

    /// `n` MiB.
    pub const fn mib(n: u64) -> Self {
        Self(n << 20)
    }

    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        bytesize::ByteSize::from_str(s.trim())
            .map(|b| Self(b.as_u64()))
            .map_err(|e| format!("expected a size like \"4MiB\" or \"512KB\": {e}"))
    }
}

/// Exact units, largest first, binary before decimal: 4 MiB prints as
/// "4MiB", 512000 bytes as "500KiB", 3000000 as "3MB"; nothing is rounded.
const SIZE_UNITS: [(u64, &str); 8] = [
    (1 << 40, "TiB"),
    (1 << 30, "GiB"),
    (1 << 20, "MiB"),
    (1 << 10, "KiB"),
    (1_000_000_000_000, "TB"),
    (1_000_000_000, "GB"),
    (1_000_000, "MB"),
    (1_000, "KB"),
];

impl fmt::Display for ByteSize {
    /// The largest unit that divides the size exactly (never rounds).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        match SIZE_UNITS
            .iter()
            .find(|(u, _)| n != 0 && n.is_multiple_of(*u))
        {
            Some((u, name)) => write!(f, "{}{name}", n / u),
            None => write!(f, "{n}B"),
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ByteSizeVisitor)
    }
}

struct ByteSizeVisitor;

impl Visitor<'_> for ByteSizeVisitor {
    type Value = ByteSize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a size like \"4MiB\" or \"512KB\", or a number of bytes")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
        v.parse().map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
        Ok(ByteSize(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
        u64::try_from(v)
            .map(ByteSize)
            .map_err(|_| E::custom(format!("a size cannot be negative, got {v}")))
    }
}

/// A number then an optional SI or IEC unit, as bytesize parses it.
const SIZE_PATTERN: &str = r"^\s*[0-9]+(\.[0-9]+)?\s*([kKmMgGtTpPeE][iI]?[bB]?|[bB])?\s*$";

impl JsonSchema for ByteSize {
    fn schema_name() -> Cow<'static, str> {
        "ByteSize".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A size: \"4MiB\", \"8GiB\", \"512KB\", or a number of bytes.",
            "anyOf": [
                { "type": "string", "pattern": SIZE_PATTERN },
                { "type": "integer", "minimum": 0 }
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn durations_parse_with_units_and_as_seconds() {
        let ms = |s: &str| s.parse::<Duration>().unwrap().get().as_millis();
        assert_eq!(ms("30s"), 30_000);
        assert_eq!(ms("250ms"), 250);
        assert_eq!(ms("2m"), 120_000);
        assert_eq!(ms("1h 30m"), 5_400_000);
        assert_eq!(ms("30"), 30_000);
        assert_eq!(ms("0.25"), 250);
        assert_eq!(ms(" 10m "), 600_000);
        assert!("30 parsecs".parse::<Duration>().is_err());
        assert!("-1".parse::<Duration>().is_err());
        assert!("".parse::<Duration>().is_err());
    }

    #[test]
    fn durations_round_trip_through_their_human_form() {
        for d in [
            Duration::from_millis(250),
            Duration::from_secs(1),
            Duration::from_secs(120),
            Duration::from_millis(1500),
            Duration::from_secs(0),
        ] {
            let s = d.to_string();
            assert_eq!(s.parse::<Duration>().unwrap(), d, "{s}");
        }
        assert_eq!(Duration::from_secs(120).to_string(), "2m");
        assert_eq!(Duration::from_millis(250).to_string(), "250ms");
    }

    #[test]
    fn durations_deserialize_from_strings_and_numbers() {
        let d = |v: serde_json::Value| serde_json::from_value::<Duration>(v);
        assert_eq!(d("5s".into()).unwrap(), Duration::from_secs(5));
        assert_eq!(d(5.into()).unwrap(), Duration::from_secs(5));
        assert_eq!(d(0.5.into()).unwrap(), Duration::from_millis(500));
        assert!(d((-1).into()).is_err());
        assert!(d(true.into()).is_err());
        assert_eq!(
            serde_json::to_value(Duration::from_secs(30)).unwrap(),
            "30s"
        );
    }

    #[test]
    fn sizes_parse_binary_and_decimal_units() {
        let b = |s: &str| s.parse::<ByteSize>().unwrap().bytes();
        assert_eq!(b("4MiB"), 4 << 20);
        assert_eq!(b("8GiB"), 8 << 30);
        assert_eq!(b("512KB"), 512_000);
        assert_eq!(b("4 MiB"), 4 << 20);
        assert_eq!(b("1024"), 1024);
        assert!("4 parsecs".parse::<ByteSize>().is_err());
        assert!("lots".parse::<ByteSize>().is_err());
    }

    #[test]
    fn sizes_print_exactly_and_round_trip() {
        assert_eq!(ByteSize::mib(4).to_string(), "4MiB");
        assert_eq!(ByteSize::mib(256).to_string(), "256MiB");
        assert_eq!(ByteSize::from_bytes(512_000).to_string(), "500KiB");
        assert_eq!(ByteSize::from_bytes(3_000_000).to_string(), "3MB");
        assert_eq!(ByteSize::from_bytes(1000 << 10).to_string(), "1000KiB");
        assert_eq!(ByteSize::from_bytes(1023).to_string(), "1023B");
        assert_eq!(ByteSize::from_bytes(0).to_string(), "0B");
        for n in [0, 1, 1023, 4 << 20, 512_000, 3 << 30, 12_345_678] {
            let s = ByteSize::from_bytes(n).to_string();
            assert_eq!(s.parse::<ByteSize>().unwrap().bytes(), n, "{s}");
        }
    }

    #[test]
    fn sizes_deserialize_from_strings_and_integers() {
        let b = |v: serde_json::Value| serde_json::from_value::<ByteSize>(v);
        assert_eq!(b("4MiB".into()).unwrap(), ByteSize::mib(4));
        assert_eq!(b(4096.into()).unwrap(), ByteSize::from_bytes(4096));
        assert!(b((-1).into()).is_err());
        assert!(b(1.5.into()).is_err());
    }
}
