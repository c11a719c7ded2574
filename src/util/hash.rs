//! Content hashes and canonical serialisations (what the object store and the record name things by).

use std::fs::File;
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::util::error::{Error, IoContext, Result};

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Hash a file on disk without storing it.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).at("cannot open", path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf).at("cannot read", path)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

pub fn is_sha256(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

pub fn json_bytes<T: serde::Serialize>(v: &T) -> Result<Vec<u8>> {
    let mut b = serde_json::to_vec_pretty(v)?;
    b.push(b'\n');
    Ok(b)
}
pub fn toml_string<T: serde::Serialize>(v: &T) -> Result<String> {
    toml::to_string(v).map_err(|e| Error::internal(format!("cannot write TOML: {e}")))
}
