//! Lowercase hexadecimal, the text form of hashes in messages, run ids and the JSON object form of
//! records (the compact record line carries op ids in base64url, to be short: `oplog::line`).

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Writes the lowercase hex of `bytes` into `out`, which must be twice as long.
pub(crate) fn write_lower_hex(out: &mut [u8], bytes: &[u8]) {
    debug_assert_eq!(out.len(), bytes.len() * 2);
    for (pair, byte) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0x0f)];
    }
}

/// Appends the lowercase hex of `bytes` to `out`.
pub(crate) fn push_lower_hex(out: &mut String, bytes: &[u8]) {
    out.reserve(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
}

/// The value of each lowercase hex digit; 0xff for every other byte.
const DIGIT_VALUES: [u8; 256] = {
    let mut values = [0xff; 256];
    let mut digit = 0;
    while digit < 16 {
        values[DIGITS[digit] as usize] = digit as u8;
        digit += 1;
    }
    values
};

/// Decodes exactly `N` bytes from `text`, which must be `2 * N` lowercase hex digits.
pub(crate) fn decode_lower_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != N * 2 {
        return None;
    }
    let mut bytes = [0u8; N];
    let mut invalid = 0u8;
    for (byte, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
        let (high, low) = (
            DIGIT_VALUES[usize::from(pair[0])],
            DIGIT_VALUES[usize::from(pair[1])],
        );
        invalid |= (high | low) & 0xf0;
        *byte = (high << 4) | (low & 0x0f);
    }
    (invalid == 0).then_some(bytes)
}

/// Appends the bytes that `text`, lowercase hex digits of any even length, encodes to `out`;
/// `false` (with `out` as it was) when `text` is not that.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) fn decode_lower_hex_into(text: &str, out: &mut Vec<u8>) -> bool {
    let digits = text.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return false;
    }
    let start = out.len();
    out.reserve(digits.len() / 2);
    let mut invalid = 0u8;
    for pair in digits.chunks_exact(2) {
        let (high, low) = (
            DIGIT_VALUES[usize::from(pair[0])],
            DIGIT_VALUES[usize::from(pair[1])],
        );
        invalid |= (high | low) & 0xf0;
        out.push((high << 4) | (low & 0x0f));
    }
    if invalid != 0 {
        out.truncate(start);
    }
    invalid == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_malformed_text() {
        let mut text = String::new();
        push_lower_hex(&mut text, &[0x00, 0x9f, 0xff]);
        assert_eq!(text, "009fff");
        assert_eq!(decode_lower_hex::<3>(&text), Some([0x00, 0x9f, 0xff]));
        assert_eq!(
            decode_lower_hex::<3>("009FFF"),
            None,
            "uppercase is not canonical"
        );
        assert_eq!(decode_lower_hex::<3>("009ff"), None);
        assert_eq!(decode_lower_hex::<3>("009fffaa"), None);
        assert_eq!(decode_lower_hex::<1>("zz"), None);
        assert_eq!(decode_lower_hex::<1>("é"), None);
        let mut out = vec![7];
        assert!(decode_lower_hex_into(&text, &mut out));
        assert_eq!(out, [7, 0x00, 0x9f, 0xff]);
        for bad in ["009", "00zz", "00FF", "é0"] {
            assert!(!decode_lower_hex_into(bad, &mut out), "{bad}");
            assert_eq!(out, [7, 0x00, 0x9f, 0xff], "{bad}: left as it was");
        }
    }
}
