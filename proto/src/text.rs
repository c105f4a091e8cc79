//! Text that came from a peer (an agent's dial error, a client's request target), made safe to
//! put in a log line, a status line or a response body: [`Printable`] shows it on one line,
//! control characters escaped, cut to a length.

use std::fmt;

/// Longest text shown by default, in characters.
pub const MAX_SHOWN: usize = 256;

/// Shows `text` on one line: printable characters as they are (a backslash too, so that
/// escaping twice changes nothing); `\n`, `\r`, `\t` and every other control character
/// escaped (`\n`, `\x1b`, `\u{85}`); at most `max` characters of it, then `…`. Escaping
/// makes it unable to forge a log line or a header.
#[derive(Debug, Clone, Copy)]
pub struct Printable<'a> {
    text: &'a str,
    max: usize,
}

impl<'a> Printable<'a> {
    /// At most [`MAX_SHOWN`] characters of `text`.
    pub fn new(text: &'a str) -> Printable<'a> {
        Printable::cut(text, MAX_SHOWN)
    }

    /// At most `max` characters of `text`.
    pub fn cut(text: &'a str, max: usize) -> Printable<'a> {
        Printable { text, max }
    }

    /// Printable ASCII only: anything else escaped too (a status line's reason phrase).
    pub fn ascii(self) -> Ascii<'a> {
        Ascii(self)
    }

    fn write(&self, f: &mut fmt::Formatter<'_>, ascii: bool) -> fmt::Result {
        for (shown, c) in self.text.chars().enumerate() {
            if shown == self.max {
                return f.write_str(if ascii { "..." } else { "…" });
            }
            match c {
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c if (c as u32) < 0x80 && !c.is_ascii_control() => write!(f, "{c}")?,
                c if (c as u32) < 0x80 => write!(f, "\\x{:02x}", c as u32)?,
                c if ascii || c.is_control() => write!(f, "\\u{{{:x}}}", c as u32)?,
                c => write!(f, "{c}")?,
            }
        }
        Ok(())
    }
}

impl fmt::Display for Printable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f, false)
    }
}

/// [`Printable`] restricted to printable ASCII (`…` becomes `...`).
#[derive(Debug, Clone, Copy)]
pub struct Ascii<'a>(Printable<'a>);

impl fmt::Display for Ascii<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.write(f, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first character past ASCII, U+0080, is a (C1) control: escaped as such in both
    /// forms, where U+007F, the last ASCII one, is a byte escape.
    #[test]
    fn the_edge_of_ascii_is_escaped_on_both_sides() {
        assert_eq!(Printable::new("\u{7f}\u{80}").to_string(), "\\x7f\\u{80}");
        assert_eq!(
            Printable::new("\u{7f}\u{80}").ascii().to_string(),
            "\\x7f\\u{80}"
        );
        assert_eq!(Printable::new("~\u{a0}").ascii().to_string(), "~\\u{a0}");
    }

    #[test]
    fn control_characters_are_escaped_and_long_text_is_cut() {
        let forged = "refused\n2026-12-01T00:00:00Z INFO agent connected\x1b[2J\\";
        let once = Printable::new(forged).to_string();
        assert_eq!(
            once,
            "refused\\n2026-12-01T00:00:00Z INFO agent connected\\x1b[2J\\"
        );
        assert_eq!(
            Printable::new(&once).to_string(),
            once,
            "escaping twice changes nothing"
        );
        assert_eq!(Printable::cut("abcdef", 3).to_string(), "abc…");
        assert_eq!(Printable::cut("abc", 3).to_string(), "abc");
        assert_eq!(Printable::new("grüße\u{85}").to_string(), "grüße\\u{85}");
        assert_eq!(
            Printable::new("grüße").ascii().to_string(),
            "gr\\u{fc}\\u{df}e"
        );
        assert_eq!(Printable::cut("abcdef", 3).ascii().to_string(), "abc...");
        assert_eq!(Printable::new("a\tb\rc").ascii().to_string(), "a\\tb\\rc");
    }
}
