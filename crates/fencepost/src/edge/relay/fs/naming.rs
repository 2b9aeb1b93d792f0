//! How a device id becomes a file name (`host%41.jsonl`), and which names are device files.

use super::*;

/// Encoded names longer than this are shortened to a prefix and a hash.
pub(super) const MAX_PLAIN_STEM_BYTES: usize = 160;

/// The length of the readable prefix kept in a shortened name.
pub(super) const SHORTENED_PREFIX_BYTES: usize = 96;

/// The file name (in the relay's `devices/` folder) of `device_id`'s log.
///
/// Bytes `a`–`z`, `0`–`9`, `-` and `_` are kept; every other byte becomes `%` and two uppercase hex
/// digits. The mapping is injective even on a case-insensitive file system, no name contains a
/// path separator or starts with a dot, a Windows device name (`con`, `nul`, …) has its first letter
/// escaped, and a name that would be too long is cut and completed with `~` and a hash of the id.
///
/// ```
/// use fencepost::relay::device_file_name;
/// assert_eq!(device_file_name("laptop-1"), "laptop-1.jsonl");
/// assert_eq!(device_file_name("../../etc"), "%2E%2E%2F%2E%2E%2Fetc.jsonl");
/// assert_ne!(device_file_name("Phone"), device_file_name("phone"));
/// ```
pub fn device_file_name(device_id: &str) -> String {
    let mut stem = String::with_capacity(device_id.len() + 8);
    for byte in device_id.bytes() {
        match byte {
            b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => stem.push(char::from(byte)),
            _ => push_escape(&mut stem, byte),
        }
    }
    if is_windows_device_name(&stem) {
        let first = stem.remove(0);
        let mut escaped = String::with_capacity(stem.len() + 3);
        push_escape(&mut escaped, first as u8);
        escaped.push_str(&stem);
        stem = escaped;
    }
    if stem.len() > MAX_PLAIN_STEM_BYTES {
        let digest = Sha256::digest(device_id.as_bytes());
        stem.truncate(SHORTENED_PREFIX_BYTES);
        stem.push('~');
        crate::hex::push_lower_hex(&mut stem, &digest[..16]);
    }
    stem.push_str(LOG_EXTENSION);
    stem
}

pub(super) fn push_escape(out: &mut String, byte: u8) {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(DIGITS[usize::from(byte >> 4)]));
    out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
}

pub(super) fn is_windows_device_name(stem: &str) -> bool {
    matches!(stem, "con" | "prn" | "aux" | "nul")
        || (stem.len() == 4
            && (stem.starts_with("com") || stem.starts_with("lpt"))
            && stem.as_bytes()[3].is_ascii_digit())
}

/// Whether `name` could have been made by [`device_file_name`].
pub(super) fn is_device_file_name(name: &str) -> bool {
    name.strip_suffix(LOG_EXTENSION).is_some_and(|stem| {
        !stem.is_empty()
            && stem
                .bytes()
                .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'%' | b'A'..=b'F' | b'~'))
    })
}
