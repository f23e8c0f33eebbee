//! Where a value of a policy file was written: [`Placed`], a value with its byte range in the
//! file's text, for error messages that point at the rule.
//!
//! A policy file is TOML and its values get their place from the TOML parser
//! (`toml::Spanned`). The built-in policy is also compiled into the binary as JSON, one text
//! per rule (build.rs, `crate::builtin`), which `txbox` reads instead of parsing its TOML (#18);
//! that form has no text to point into, so its values deserialize without a place (`0..0`),
//! inside [`unplaced`] only.

use std::cell::Cell;
use std::ops::Range;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

thread_local! {
    /// Set while [`unplaced`] runs on this thread.
    static UNPLACED: Cell<bool> = const { Cell::new(false) };
}

/// A value and the byte range it was written at in its policy file.
#[derive(Debug, Clone)]
pub(crate) struct Placed<T> {
    span: Range<usize>,
    value: T,
}

impl<T> Placed<T> {
    #[cfg(test)]
    pub fn new(span: Range<usize>, value: T) -> Self {
        Placed { span, value }
    }

    pub fn get_ref(&self) -> &T {
        &self.value
    }

    /// Where it was written (`0..0` in the compiled built-in policy).
    pub fn span(&self) -> Range<usize> {
        self.span.clone()
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Placed<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if UNPLACED.with(Cell::get) {
            return T::deserialize(d).map(|value| Placed { span: 0..0, value });
        }
        let s = toml::Spanned::<T>::deserialize(d)?;
        Ok(Placed { span: s.span(), value: s.into_inner() })
    }
}

impl<T: Serialize> Serialize for Placed<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

/// Run `f` (a deserialization from a format without places) with every [`Placed`] value
/// deserialized as the bare value at `0..0`.
pub(crate) fn unplaced<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            UNPLACED.with(|c| c.set(self.0));
        }
    }
    let _reset = Reset(UNPLACED.with(|c| c.replace(true)));
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Doc {
        id: Placed<String>,
    }

    #[test]
    fn toml_gives_the_place_and_json_inside_unplaced_none() -> Result<(), Box<dyn std::error::Error>> {
        let text = "# c\nid = \"x\"\n";
        let d: Doc = toml::from_str(text)?;
        assert_eq!((d.id.get_ref().as_str(), &text[d.id.span()]), ("x", "\"x\""));
        let d: Doc = unplaced(|| serde_json::from_str(r#"{"id":"y"}"#))?;
        assert_eq!((d.id.get_ref().as_str(), d.id.span()), ("y", 0..0));
        // Outside `unplaced`, JSON has no place to give: refused rather than made up.
        assert!(serde_json::from_str::<Doc>(r#"{"id":"y"}"#).is_err());
        // And places come back after `unplaced` returns.
        let d: Doc = toml::from_str(text)?;
        assert_eq!(d.id.span(), 9..12);
        Ok(())
    }
}
