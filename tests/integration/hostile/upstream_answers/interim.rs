//! Informational answers before the final one, answers that have no body (204, 304, any
//! answer to `HEAD`) whatever they announce, and trailer sections.

use super::{Case, cases};

const FINAL_OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

/// `count` informational heads `interim` (a status line and fields, without the empty
/// line), then the final 200.
fn after_interim(interim: &str, count: usize) -> Vec<u8> {
    let mut out = format!("{interim}\r\n\r\n").repeat(count);
    out.push_str(FINAL_OK);
    out.into_bytes()
}

/// A chunked 200 with `hello` and then `trailers` (field lines, each with its CRLF).
fn with_trailers(trailers: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum\r\n\r\n\
         5\r\nhello\r\n0\r\n{trailers}\r\n"
    )
    .into_bytes()
}

cases! {
    a_100_continue_before_the_answer_is_passed_over =>
        Case::answer(&after_interim("HTTP/1.1 100 Continue", 1)).whole(200, b"ok").reused(),
    /// The hints' fields belong to the 103, not to the final answer.
    early_hints_fields_stay_off_the_final_answer =>
        Case::answer(&after_interim("HTTP/1.1 103 Early Hints\r\nlink: </s.css>; rel=preload", 1))
            .whole(200, b"ok")
            .without(&["link"])
            .reused(),
    thirty_informational_answers_in_a_row_are_passed_over =>
        Case::answer(&after_interim("HTTP/1.1 102 Processing", 30)).whole(200, b"ok").reused(),
    /// RFC 9110 15.2.2: 101 answers an Upgrade the request did not ask for.
    an_unsolicited_101_is_a_502 =>
        Case::answer(
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n\
              \x81\x05hello",
        )
        .bad_gateway("upstream_bad_response"),
    /// RFC 9112 6.3: a 204 ends at its head; what follows is not its body.
    a_204_with_a_body_has_none =>
        Case::answer(b"HTTP/1.1 204 No Content\r\n\r\nhello").whole(204, b""),
    /// RFC 9110 8.6: a 204 never carries Content-Length.
    a_204_with_a_content_length_has_no_body_and_no_length =>
        Case::answer(b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\nhello")
            .whole(204, b"")
            .without(&["content-length"]),
    a_304_with_a_body_has_none =>
        Case::answer(b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\nhello")
            .whole(304, b""),
    /// RFC 9110 9.3.2: the length a `GET` would have, and no body.
    a_head_answer_keeps_its_content_length =>
        Case::answer(b"HTTP/1.1 200 OK\r\ncontent-length: 1234\r\n\r\n")
            .for_head()
            .whole(200, b"")
            .with_field("content-length", "1234")
            .reused(),
    a_head_answer_with_a_body_has_none =>
        Case::answer(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello")
            .for_head()
            .whole(200, b""),
    valid_trailers_end_the_body =>
        Case::answer(&with_trailers("x-checksum: abc\r\n")).whole(200, b"hello").reused(),
    a_trailer_line_without_a_colon_cuts_the_stream =>
        Case::answer(&with_trailers("no colon here\r\n")).cut(200, b"hello"),
    a_trailer_with_a_space_in_its_name_cuts_the_stream =>
        Case::answer(&with_trailers("x bad: 1\r\n")).cut(200, b"hello"),
    more_than_100_trailers_cut_the_stream =>
        Case::answer(&with_trailers(&"x: 1\r\n".repeat(101))).cut(200, b"hello"),
    a_trailer_section_cut_by_a_close_cuts_the_stream =>
        Case::answer_then_close(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nx-checksum: abc\r\n",
        )
        .cut(200, b"hello"),
}
