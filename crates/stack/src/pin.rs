//! An exact pin of a Python distribution, `name==version` (torch's NCCL and NVSHMEM pins).
//! Written to the lock as that one string, so the lock's text is what it always was.

use std::fmt;
use std::str::FromStr;

use pep440_rs::Version;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pin {
    /// The distribution's name as the index spells it, e.g. `nvidia-nccl-cu13`.
    pub name: String,
    pub version: Version,
}

impl Pin {
    pub fn new(name: impl Into<String>, version: Version) -> Pin {
        Pin {
            name: name.into(),
            version,
        }
    }
}

impl fmt::Display for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}=={}", self.name, self.version)
    }
}

impl FromStr for Pin {
    type Err = String;
    fn from_str(s: &str) -> Result<Pin, String> {
        let (name, version) = s
            .split_once("==")
            .ok_or_else(|| format!("{s:?} is not NAME==VERSION"))?;
        let (name, version) = (name.trim(), version.trim());
        if name.is_empty() {
            return Err(format!("{s:?} names no distribution"));
        }
        let version = version
            .parse()
            .map_err(|e| format!("{s:?}: version {version:?}: {e}"))?;
        Ok(Pin::new(name, version))
    }
}

impl Serialize for Pin {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Pin {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Pin, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// `Option<Pin>` as the lock writes it: an empty string for none (the key is always there).
pub mod or_empty {
    use super::*;

    pub fn serialize<S: Serializer>(pin: &Option<Pin>, s: S) -> Result<S::Ok, S::Error> {
        match pin {
            Some(p) => p.serialize(s),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Pin>, D::Error> {
        let text = String::deserialize(d)?;
        if text.is_empty() {
            return Ok(None);
        }
        text.parse().map(Some).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_as_one_string() {
        let pin: Pin = "nvidia-nccl-cu13==2.28.9".parse().unwrap();
        assert_eq!(pin.name, "nvidia-nccl-cu13");
        assert_eq!(pin.version, Version::from_str("2.28.9").unwrap());
        assert_eq!(pin.to_string(), "nvidia-nccl-cu13==2.28.9");
        assert_eq!(
            serde_json::to_string(&pin).unwrap(),
            "\"nvidia-nccl-cu13==2.28.9\""
        );
        assert_eq!(
            serde_json::from_str::<Pin>("\"nvidia-nccl-cu13==2.28.9\"").unwrap(),
            pin
        );
    }

    #[test]
    fn refuses_what_is_not_a_pin() {
        for bad in [
            "",
            "nvidia-nccl-cu13",
            "==2.28.9",
            "nvidia-nccl-cu13==not a version",
        ] {
            assert!(bad.parse::<Pin>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn none_is_the_empty_string() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct T {
            #[serde(with = "or_empty")]
            pin: Option<Pin>,
        }
        let none = T { pin: None };
        assert_eq!(serde_json::to_string(&none).unwrap(), r#"{"pin":""}"#);
        assert_eq!(serde_json::from_str::<T>(r#"{"pin":""}"#).unwrap(), none);
        let some = T {
            pin: Some("nvidia-nvshmem-cu13==3.4.5".parse().unwrap()),
        };
        let text = serde_json::to_string(&some).unwrap();
        assert_eq!(text, r#"{"pin":"nvidia-nvshmem-cu13==3.4.5"}"#);
        assert_eq!(serde_json::from_str::<T>(&text).unwrap(), some);
    }
}
