//! Helpers shared by the example programs' tests.

/// Whether something listens on TCP `port` (from /proc/net/tcp*, without connecting: the
/// pingpong server accepts exactly one connection).
pub(crate) fn listening(port: u16) -> bool {
    let wanted = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|file| {
        std::fs::read_to_string(file).is_ok_and(|text| {
            text.lines()
                .skip(1)
                .any(|line| line.contains(&wanted) && line.split_whitespace().nth(3) == Some("0A"))
        })
    })
}
