//! Response heads: line endings, field syntax, versions and status lines, and answers that
//! are not HTTP/1.x at all or end before their head does.

use super::{Case, cases};
use crate::common::fake::{Script, Step};

cases! {
    /// RFC 9112 5.2: a proxy replaces the message with a 502 or unfolds the field.
    obsolete_line_folding_is_a_502 =>
        Case::answer(b"HTTP/1.1 200 OK\r\nx-folded: a\r\n b\r\ncontent-length: 2\r\n\r\nok")
            .bad_gateway("upstream_failed"),
    /// RFC 9112 2.2: a recipient may take a bare LF for a line end.
    bare_lf_line_ends_are_read_as_line_ends =>
        Case::answer(b"HTTP/1.1 200 OK\ncontent-length: 2\n\nok").whole(200, b"ok").reused(),
    /// RFC 9112 2.2: a bare CR makes its element invalid (or becomes a space).
    a_bare_cr_in_a_field_value_is_a_502 =>
        Case::answer(b"HTTP/1.1 200 OK\r\nx-a: a\rb\r\ncontent-length: 2\r\n\r\nok")
            .bad_gateway("upstream_failed"),
    bare_cr_line_ends_are_a_502 =>
        Case::answer(b"HTTP/1.1 200 OK\rcontent-length: 2\r\r\nok").bad_gateway("upstream_failed"),
    /// RFC 9112 5.1: never read as `content-length`.
    whitespace_before_a_colon_is_a_502 =>
        Case::answer(b"HTTP/1.1 200 OK\r\ncontent-length : 2\r\n\r\nok")
            .bad_gateway("upstream_failed"),
    a_field_name_with_a_space_is_a_502 =>
        Case::answer(b"HTTP/1.1 200 OK\r\nx bad: 1\r\ncontent-length: 2\r\n\r\nok")
            .bad_gateway("upstream_failed"),
    a_field_name_with_a_delimiter_is_a_502 =>
        Case::answer(b"HTTP/1.1 200 OK\r\nx(y): 1\r\ncontent-length: 2\r\n\r\nok")
            .bad_gateway("upstream_failed"),
    a_field_line_without_a_colon_is_a_502 =>
        Case::answer(b"HTTP/1.1 200 OK\r\nno colon here\r\ncontent-length: 2\r\n\r\nok")
            .bad_gateway("upstream_failed"),
    /// RFC 9110 5.5: NUL in a value is dangerous; reject or replace.
    a_nul_in_a_field_value_is_a_502 =>
        Case::answer(b"HTTP/1.1 200 OK\r\nx-a: a\0b\r\ncontent-length: 2\r\n\r\nok")
            .bad_gateway("upstream_failed"),
    /// HTTP/1.0 without `keep-alive`: the upstream will close it, so it is not reused.
    an_http_1_0_answer_is_forwarded_and_its_connection_not_reused =>
        Case::answer(b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok").whole(200, b"ok"),
    an_http_1_0_close_delimited_answer_is_forwarded_whole =>
        Case::answer_then_close(b"HTTP/1.0 200 OK\r\n\r\nhello").whole(200, b"hello"),
    /// RFC 9112 6.1: Transfer-Encoding in HTTP/1.0 means the framing is faulty.
    chunked_in_an_http_1_0_answer_is_a_502 =>
        Case::answer(b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
            .bad_gateway("upstream_failed"),
    a_status_line_without_a_reason_is_read =>
        Case::answer(b"HTTP/1.1 200\r\ncontent-length: 2\r\n\r\nok").whole(200, b"ok").reused(),
    an_empty_reason_is_read =>
        Case::answer(b"HTTP/1.1 200 \r\ncontent-length: 2\r\n\r\nok").whole(200, b"ok").reused(),
    status_099_is_a_502 =>
        Case::answer(b"HTTP/1.1 099 Early\r\ncontent-length: 2\r\n\r\nok")
            .bad_gateway("upstream_failed"),
    status_1000_is_a_502 =>
        Case::answer(b"HTTP/1.1 1000 Big\r\ncontent-length: 2\r\n\r\nok")
            .bad_gateway("upstream_failed"),
    a_two_digit_status_is_a_502 =>
        Case::answer(b"HTTP/1.1 20 OK\r\ncontent-length: 2\r\n\r\nok")
            .bad_gateway("upstream_failed"),
    a_lowercase_version_is_a_502 =>
        Case::answer(b"http/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .bad_gateway("upstream_failed"),
    /// What an HTTP/2 server that took the connection for its own would send first.
    an_http2_preface_is_a_502 =>
        Case::answer(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").bad_gateway("upstream_failed"),
    /// An HTTP/2 server's first frame: an empty SETTINGS.
    an_http2_settings_frame_is_a_502 =>
        Case::answer(b"\0\0\0\x04\0\0\0\0\0").bad_gateway("upstream_failed"),
    garbage_is_a_502 =>
        Case::answer(b"hello, this is not HTTP\r\n\r\n").bad_gateway("upstream_failed"),
    /// The request may have had its effect: not sent again on another connection.
    a_close_before_any_answer_is_a_502_not_a_retry =>
        Case::script(Script::new(vec![Step::Close])).bad_gateway("upstream_failed"),
    a_reset_before_any_answer_is_a_502_not_a_retry =>
        Case::script(Script::new(vec![Step::Reset])).bad_gateway("upstream_failed"),
    a_head_cut_by_a_close_is_a_502 =>
        Case::answer_then_close(b"HTTP/1.1 200 OK\r\ncontent-le").bad_gateway("upstream_failed"),
}
