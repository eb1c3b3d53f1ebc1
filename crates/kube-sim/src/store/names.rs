//! What the API server makes up for a new object: its UID, and the suffix `generateName`
//! gets (apiserver/pkg/storage/names).

/// A random UID in the usual 8-4-4-4-12 form.
pub fn new_uid() -> String {
    let bytes: [u8; 16] = rand::random();
    let hex: String = bytes.iter().fold(String::with_capacity(32), |mut hex, b| {
        use std::fmt::Write;
        let _ = write!(hex, "{b:02x}");
        hex
    });
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The five characters `generateName` appends.
pub(super) fn generated_suffix() -> String {
    // The API server appends five characters from a consonant-and-digit alphabet.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}
