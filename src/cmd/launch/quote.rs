//! Words for a POSIX shell: what `oxalign launch` prints and what ssh hands to the remote
//! shell is quoted here, so a path with spaces, quotes or `$` stays one word and runs nothing.

use std::borrow::Cow;

/// `word` as one POSIX shell word: unchanged when it holds only characters no shell treats
/// specially (letters, digits and `_-./:,+=%@`), else in single quotes, each `'` written
/// as `'\''`.
pub(crate) fn quote(word: &str) -> Cow<'_, str> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:,+=%@".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        Cow::Borrowed(word)
    } else {
        Cow::Owned(format!("'{}'", word.replace('\'', r"'\''")))
    }
}

/// `words` quoted and joined by spaces: one shell command line.
pub(crate) fn command_line<'a>(words: impl IntoIterator<Item = &'a str>) -> String {
    words.into_iter().map(quote).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_words_are_single_quoted() {
        assert_eq!(quote("10.0.0.5:7101"), "10.0.0.5:7101");
        assert_eq!(quote("/runs/a-b_c.toml"), "/runs/a-b_c.toml");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("my runs/$HOME"), "'my runs/$HOME'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("[::1]:7101"), "'[::1]:7101'");
        assert_eq!(quote("a$(id)`id`;b"), "'a$(id)`id`;b'");
        assert_eq!(command_line(["ls", "a b"]), "ls 'a b'");
    }

    #[test]
    fn the_shell_reads_back_the_original_words() {
        let words = ["x y", "it's", "$HOME", "a\"b", "\\n", "-", "*"];
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf '%s\\n' {}", command_line(words)))
            .output()
            .unwrap();
        let got = String::from_utf8(out.stdout).unwrap();
        assert_eq!(got.lines().collect::<Vec<_>>(), words);
    }
}
