//! Files a repository from elsewhere may have put in a study's work tree or `.git`: read only when
//! they are regular files of a bounded size (never through a symlink, never waiting on a FIFO or
//! a device), and written by replacing the name (never through a symlink planted there).

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The bytes of `path` if it is a regular file of at most `max` bytes: the file is opened without
/// following a symlink and without blocking (a FIFO is refused, not waited on), then checked on
/// its open descriptor, and at most `max + 1` bytes are read (a file growing meanwhile is
/// refused too). The error names the path and what was wrong.
pub fn read_regular(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind};
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                Error::new(
                    ErrorKind::InvalidData,
                    format!("{}: is a symlink", path.display()),
                )
            } else {
                Error::new(e.kind(), format!("{}: {e}", path.display()))
            }
        })?;
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("{}: not a regular file", path.display()),
        ));
    }
    let too_big = || {
        Error::new(
            ErrorKind::InvalidData,
            format!("{}: more than {max} bytes", path.display()),
        )
    };
    if m.len() > max {
        return Err(too_big());
    }
    let mut bytes = Vec::with_capacity(m.len() as usize);
    f.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(too_big());
    }
    Ok(bytes)
}

/// `read_regular` as UTF-8 text.
pub fn read_regular_text(path: &Path, max: u64) -> std::io::Result<String> {
    String::from_utf8(read_regular(path, max)?).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: not UTF-8", path.display()),
        )
    })
}

/// Write `bytes` as `path`: into a new file beside it, then renamed over the name, so a symlink
/// (or anything else) planted at `path` is replaced, never written through. The new file is
/// flushed before the rename, so a crash leaves the old file or the new one, not half of one.
pub fn write_replacing(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(
        ".{name}.{}.{:08x}.tmp",
        std::process::id(),
        rand::random::<u32>()
    ));
    let written = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        })
        .and_then(|()| fs::rename(&tmp, path));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_small_regular_files_are_read_and_writes_replace_a_planted_symlink() {
        let d = tempfile::tempdir().expect("tmp");
        let f = d.path().join("f");
        fs::write(&f, b"hello").expect("write");
        assert_eq!(read_regular(&f, 5).expect("read"), b"hello");
        let e = read_regular(&f, 4).expect_err("too big");
        assert!(e.to_string().contains("more than 4 bytes"), "{e}");

        let outside = d.path().join("outside");
        fs::write(&outside, b"keep").expect("write");
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&outside, &link).expect("symlink");
        let e = read_regular(&link, 100).expect_err("symlink");
        assert!(e.to_string().contains("symlink"), "{e}");
        let zero = d.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
        assert!(read_regular(&zero, 100).is_err());

        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let e = read_regular(&fifo, 100).expect_err("fifo");
        assert!(e.to_string().contains("not a regular file"), "{e}");

        write_replacing(&link, b"new").expect("write");
        assert_eq!(fs::read(&outside).expect("outside"), b"keep");
        assert!(
            !fs::symlink_metadata(&link)
                .expect("meta")
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read(&link).expect("link"), b"new");
        let left: Vec<_> = fs::read_dir(d.path())
            .expect("dir")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "no temporary file left behind");
    }
}
