//! Body framing attacks: `Content-Length` against `Transfer-Encoding`, transfer codings
//! other than chunked, broken chunk framing, and bodies longer or shorter than announced.

use super::{Case, cases};

const OK_HELLO: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n";

/// A 200 whose head ends with `fields` (each line with its CRLF), then `body`, in one write.
fn answer(fields: &str, body: &[u8]) -> Vec<u8> {
    let mut out = OK_HELLO.to_vec();
    out.extend_from_slice(fields.as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// A chunked 200 with `body` as its (possibly broken) chunked body.
fn chunked(body: &[u8]) -> Vec<u8> {
    answer("transfer-encoding: chunked\r\n", body)
}

/// Chunks of one byte each carrying 900 bytes of chunk extension, in one write: the 19th
/// takes the body's extensions past 16 KiB.
fn long_extensions() -> Vec<u8> {
    let extension = format!(";{}", "e".repeat(899));
    let mut body = Vec::new();
    for _ in 0..24 {
        body.extend_from_slice(format!("1{extension}\r\nx\r\n").as_bytes());
    }
    body.extend_from_slice(b"0\r\n\r\n");
    chunked(&body)
}

cases! {
    /// RFC 9112 6.3: both is a sign of response splitting, to be handled as an error.
    content_length_and_chunked_is_a_502 =>
        Case::answer(&answer(
            "content-length: 5\r\ntransfer-encoding: chunked\r\n",
            b"5\r\nhello\r\n0\r\n\r\n",
        ))
        .bad_gateway("upstream_bad_response"),
    /// Chunked, but not as the last coding: the payload is still gzip-coded, and the
    /// client would get it with its `Transfer-Encoding` taken off.
    chunked_before_another_coding_is_a_502 =>
        Case::answer_then_close(&answer(
            "transfer-encoding: chunked, gzip\r\n",
            b"5\r\nhello\r\n0\r\n\r\n",
        ))
        .bad_gateway("upstream_bad_response"),
    /// gzip then chunked: the chunks would be undone and the gzip coding left on the
    /// payload with nothing to say so.
    gzip_under_chunked_is_a_502 =>
        Case::answer(&answer(
            "transfer-encoding: gzip, chunked\r\n",
            b"5\r\nhello\r\n0\r\n\r\n",
        ))
        .bad_gateway("upstream_bad_response"),
    gzip_transfer_coding_alone_is_a_502 =>
        Case::answer_then_close(&answer("transfer-encoding: gzip\r\n", b"\x1f\x8b\x08\x00"))
            .bad_gateway("upstream_bad_response"),
    /// `identity` is no longer a transfer coding (RFC 9112 7): unknown, like any other.
    identity_transfer_coding_is_a_502 =>
        Case::answer_then_close(&answer("transfer-encoding: identity\r\n", b"hello"))
            .bad_gateway("upstream_bad_response"),
    a_chunk_size_that_is_not_hex_is_a_502 =>
        Case::answer(&chunked(b"zz\r\nhello\r\n0\r\n\r\n")).bad_gateway("upstream_failed"),
    a_negative_chunk_size_is_a_502 =>
        Case::answer(&chunked(b"-5\r\nhello\r\n0\r\n\r\n")).bad_gateway("upstream_failed"),
    a_chunk_size_with_a_0x_prefix_is_a_502 =>
        Case::answer(&chunked(b"0x5\r\nhello\r\n0\r\n\r\n")).bad_gateway("upstream_failed"),
    /// 2^64: past any length the proxy could count.
    a_chunk_size_overflowing_64_bits_is_a_502 =>
        Case::answer(&chunked(b"10000000000000000\r\nhello\r\n0\r\n\r\n"))
            .bad_gateway("upstream_failed"),
    a_bare_lf_in_a_chunk_extension_is_a_502 =>
        Case::answer(&chunked(b"5;name\nhello\r\n0\r\n\r\n")).bad_gateway("upstream_failed"),
    chunk_extensions_are_passed_over =>
        Case::answer(&chunked(b"5;name=value;q=\"a b\"\r\nhello\r\n0;last\r\n\r\n"))
            .whole(200, b"hello")
            .reused(),
    /// 16 KiB of extensions per body, as hyper allows: the chunks before the limit go
    /// through, then the stream is cut.
    chunk_extensions_past_16_kib_cut_the_stream =>
        Case::answer(&long_extensions()).cut(200, b"xxxxxxxxxxxxxxxxxx"),
    chunk_data_without_its_crlf_cuts_the_stream =>
        Case::answer(&chunked(b"5\r\nhelloXY0\r\n\r\n")).cut(200, b"hello"),
    chunk_data_longer_than_its_size_cuts_the_stream =>
        Case::answer(&chunked(b"3\r\nhello\r\n0\r\n\r\n")).cut(200, b"hel"),
    a_chunked_body_closed_before_its_last_chunk_is_cut =>
        Case::answer_then_close(&chunked(b"5\r\nhello\r\n")).cut(200, b"hello"),
    bytes_after_the_last_chunk_are_not_forwarded =>
        Case::answer(&chunked(b"5\r\nhello\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n"))
            .whole(200, b"hello"),
    a_body_longer_than_its_content_length_is_trimmed_and_the_connection_dropped =>
        Case::answer_then_close(&answer("content-length: 5\r\n", b"helloEXTRA"))
            .whole(200, b"hello"),
    a_body_shorter_than_its_content_length_is_cut =>
        Case::answer_then_close(&answer("content-length: 10\r\n", b"hello")).cut(200, b"hello"),
    a_negative_content_length_is_a_502 =>
        Case::answer(&answer("content-length: -5\r\n", b"hello")).bad_gateway("upstream_failed"),
    a_content_length_that_is_not_a_number_is_a_502 =>
        Case::answer(&answer("content-length: five\r\n", b"hello"))
            .bad_gateway("upstream_failed"),
    a_signed_content_length_is_a_502 =>
        Case::answer(&answer("content-length: +5\r\n", b"hello")).bad_gateway("upstream_failed"),
    a_hex_content_length_is_a_502 =>
        Case::answer(&answer("content-length: 0x5\r\n", b"hello")).bad_gateway("upstream_failed"),
    /// 2^64.
    a_content_length_overflowing_64_bits_is_a_502 =>
        Case::answer(&answer("content-length: 18446744073709551616\r\n", b"hello"))
            .bad_gateway("upstream_failed"),
    differing_content_length_fields_are_a_502 =>
        Case::answer(&answer("content-length: 5\r\ncontent-length: 6\r\n", b"hello!"))
            .bad_gateway("upstream_failed"),
    a_content_length_list_that_differs_is_a_502 =>
        Case::answer(&answer("content-length: 5, 6\r\n", b"hello!"))
            .bad_gateway("upstream_failed"),
    leading_zeros_in_content_length_are_a_length =>
        Case::answer(&answer("content-length: 005\r\n", b"hello")).whole(200, b"hello").reused(),
    /// A body that runs until the upstream closes, as HTTP/1.0 and 1.1 allow.
    a_close_delimited_body_is_forwarded_whole =>
        Case::answer_then_close(&answer("", b"hello")).whole(200, b"hello"),
}
