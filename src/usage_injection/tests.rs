//! Request rewriting and usage-chunk removal, byte for byte, over any chunking.

use bytes::Bytes;
use http_body_util::Full;
use proptest::prelude::*;

use super::*;

fn models() -> Vec<String> {
    vec!["*".into()]
}

fn injected(body: &str) -> String {
    match rewrite(body.as_bytes(), &models()) {
        Rewrite::Inject(v) => String::from_utf8(v).unwrap(),
        other => panic!("{body}: {other:?}"),
    }
}

#[test]
fn adds_stream_options_keeping_every_other_byte() {
    let body = "{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"}\"}]}  \n";
    assert_eq!(
        injected(body),
        "{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"}\"}],\"stream_options\":{\"include_usage\":true}}  \n"
    );
    let pretty = "{\n  \"stream\": true,\n  \"model\": \"m\"\n}";
    let out = injected(pretty);
    assert_eq!(
        out,
        "{\n  \"stream\": true,\n  \"model\": \"m\"\n,\"stream_options\":{\"include_usage\":true}}"
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["stream_options"]["include_usage"], true);
}

#[test]
fn completes_or_fixes_existing_stream_options() {
    assert_eq!(
        injected(r#"{"stream":true,"stream_options":{}}"#),
        r#"{"stream":true,"stream_options":{"include_usage":true}}"#
    );
    assert_eq!(
        injected(r#"{"stream":true,"stream_options":{"continuous_usage_stats":false} }"#),
        r#"{"stream":true,"stream_options":{"continuous_usage_stats":false,"include_usage":true} }"#
    );
    assert_eq!(
        injected(r#"{"stream":true,"stream_options":{"include_usage": false}}"#),
        r#"{"stream":true,"stream_options":{"include_usage": true}}"#
    );
    assert_eq!(
        injected(r#"{"stream":true,"stream_options":null}"#),
        r#"{"stream":true,"stream_options":{"include_usage":true}}"#
    );
}

#[test]
fn leaves_everything_else_alone() {
    let m = models();
    let cases = [
        r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
        r#"{"stream":false}"#,
        r#"{"messages":[]}"#,
        r#"{"stream":"true"}"#,
        r#"{"stream":true,"stream":true}"#,
        r#"{"stream":true,"stream_options":{"include_usage":1}}"#,
        r#"{"stream":true,"stream_options":[]}"#,
        r#"{"stream":true,"model":5}"#,
        r#"[{"stream":true}]"#,
        r#"{"stream":true"#,
        "",
        "not json",
    ];
    for body in cases {
        let want = if body.contains(r#""include_usage":true"#) {
            Rewrite::ClientAsked
        } else {
            Rewrite::Untouched
        };
        assert_eq!(rewrite(body.as_bytes(), &m), want, "{body}");
    }
    let only_llama = vec!["llama-*".to_owned()];
    assert_eq!(
        rewrite(br#"{"stream":true,"model":"qwen"}"#, &only_llama),
        Rewrite::Untouched
    );
    assert_eq!(
        rewrite(br#"{"stream":true}"#, &only_llama),
        Rewrite::Untouched
    );
    assert!(matches!(
        rewrite(br#"{"stream":true,"model":"llama-3"}"#, &only_llama),
        Rewrite::Inject(_)
    ));
}

fn plan(limit: usize) -> InjectPlan {
    InjectPlan {
        models: models().into(),
        limit,
    }
}

async fn collect<B>(body: B) -> Vec<u8>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    body.collect().await.unwrap().to_bytes().to_vec()
}

#[tokio::test]
async fn prepare_rewrites_and_fixes_content_length() {
    let body = r#"{"model":"m","stream":true}"#;
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    let (out, usage) = prepare(&plan(1024), &mut headers, Full::new(Bytes::from(body))).await;
    assert_eq!(usage, Some(UsageRequest::Injected));
    let sent = collect(out).await;
    assert_eq!(headers[CONTENT_LENGTH], sent.len().to_string().as_str());
    assert!(sent.ends_with(br#","stream_options":{"include_usage":true}}"#));
}

fn chunked(pieces: &[&str]) -> Chunks {
    Chunks(
        pieces
            .iter()
            .map(|p| Bytes::copy_from_slice(p.as_bytes()))
            .collect(),
    )
}

/// A body delivered in the given frames.
struct Chunks(VecDeque<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.get_mut().0.pop_front().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

#[tokio::test]
async fn prepare_passes_over_limit_and_client_asked_bodies_untouched() {
    let big = r#"{"model":"m","stream":true,"messages":[]}"#;
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_LENGTH, HeaderValue::from(big.len()));
    let (out, usage) = prepare(&plan(10), &mut headers, Full::new(Bytes::from(big))).await;
    assert!(
        matches!(out, ForwardBody::Stream { .. }),
        "declared length over the limit"
    );
    assert_eq!((usage, collect(out).await), (None, big.as_bytes().to_vec()));

    // No declared length: read ahead until the limit is passed, then replay and stream on.
    let mut headers = HeaderMap::new();
    let body = chunked(&[r#"{"model":"m","#, r#""stream":true,"#, r#""messages":[]}"#]);
    let (out, usage) = prepare(&plan(20), &mut headers, body).await;
    assert_eq!(usage, None);
    assert_eq!(collect(out).await, big.as_bytes());
    assert!(headers.get(CONTENT_LENGTH).is_none());

    let asked = r#"{"stream":true,"stream_options":{"include_usage":true}}"#;
    let body = chunked(&[&asked[..9], &asked[9..]]);
    let (out, usage) = prepare(&plan(1024), &mut HeaderMap::new(), body).await;
    assert_eq!(usage, Some(UsageRequest::ClientAsked));
    assert_eq!(collect(out).await, asked.as_bytes());
}

// ---- the usage-chunk filter ------------------------------------------------------------

const CONTENT: &str = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n";
const FINISH: &str =
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
const USAGE: &str = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n";
const DONE: &str = "data: [DONE]\n\n";

fn run_filter(stream: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut f = UsageFilter::new();
    let mut out = Vec::new();
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
        let cut = cut.clamp(at, stream.len());
        out.extend_from_slice(&f.push(Bytes::copy_from_slice(&stream[at..cut])));
        at = cut;
    }
    out.extend_from_slice(&f.finish());
    out
}

fn with_line_ends(s: &str, end: &str) -> String {
    s.replace('\n', end)
}

#[test]
fn removes_only_the_usage_chunk_whole_frames() {
    let with = [CONTENT, CONTENT, FINISH, USAGE, DONE].concat();
    let without = [CONTENT, CONTENT, FINISH, DONE].concat();
    assert_eq!(run_filter(with.as_bytes(), &[]), without.as_bytes());
    // Coalesced with [DONE], and on its own.
    let cuts = [CONTENT.len(), 2 * CONTENT.len() + FINISH.len()];
    assert_eq!(run_filter(with.as_bytes(), &cuts), without.as_bytes());
}

#[test]
fn a_frame_of_whole_events_is_passed_on_as_the_same_bytes() {
    let mut f = UsageFilter::new();
    let frame = Bytes::from([CONTENT, FINISH].concat());
    let out = f.push(frame.clone());
    assert_eq!(out.as_ptr(), frame.as_ptr(), "no copy");
    assert_eq!(out.len(), frame.len());
    // A frame that ends mid-event after its "choices" showed content is released at once.
    let split = CONTENT.len() - 5;
    let out = f.push(Bytes::copy_from_slice(&CONTENT.as_bytes()[..split]));
    assert_eq!(out.len(), split);
    assert!(!f.holds());
}

#[test]
fn clients_that_never_asked_see_identical_bytes_without_usage_chunks() {
    let plain = [CONTENT, ": keep-alive\n\n", FINISH, DONE].concat();
    assert_eq!(
        run_filter(plain.as_bytes(), &[7, 100, 101]),
        plain.as_bytes()
    );
}

proptest! {
    #[test]
    fn any_chunking_and_line_ends_give_the_stream_without_the_usage_chunk(
        cuts in prop::collection::vec(0usize..600, 0..12),
        end in prop::sample::select(vec!["\n", "\r\n", "\r"]),
        one_byte in any::<bool>(),
    ) {
        let with = with_line_ends(&[CONTENT, FINISH, USAGE, DONE].concat(), end);
        let without = with_line_ends(&[CONTENT, FINISH, DONE].concat(), end);
        let mut cuts = if one_byte { (1..with.len()).collect() } else { cuts };
        cuts.sort_unstable();
        prop_assert_eq!(run_filter(with.as_bytes(), &cuts), without.as_bytes().to_vec());
        let untouched = with_line_ends(&[CONTENT, FINISH, DONE].concat(), end);
        prop_assert_eq!(run_filter(untouched.as_bytes(), &cuts), untouched.as_bytes().to_vec());
    }
}

#[test]
fn a_choices_line_outside_the_data_decides_nothing_whatever_the_chunking() {
    // Found by fuzzing: a non-data line naming "choices" released the event early when
    // it straddled frames, while the whole event was judged by its data and removed.
    let stream = "\"choices\"\ndata:{\"choices\":[],\"usage\":{\"prompt_tokens\":2}}\n\n";
    let whole = run_filter(stream.as_bytes(), &[]);
    assert_eq!(whole, b"");
    for cut in 1..stream.len() {
        assert_eq!(run_filter(stream.as_bytes(), &[cut]), whole, "cut at {cut}");
    }
    let cuts: Vec<usize> = (7..stream.len()).step_by(7).collect();
    assert_eq!(run_filter(stream.as_bytes(), &cuts), whole);
}

#[test]
fn an_event_past_the_size_bound_is_never_the_usage_chunk() {
    let pad = "x".repeat(strip::MAX_USAGE_EVENT);
    let stream = format!("data: {{\"choices\":[],\"usage\":{{}},\"pad\":\"{pad}\"}}\n\n");
    let whole = run_filter(stream.as_bytes(), &[]);
    assert_eq!(whole, stream.as_bytes());
    assert_eq!(run_filter(stream.as_bytes(), &[100, 5000]), whole);
}

#[test]
fn an_empty_frame_between_cr_and_lf_keeps_the_line_end_together() {
    let with = with_line_ends(&[CONTENT, USAGE, DONE].concat(), "\r\n");
    let without = with_line_ends(&[CONTENT, DONE].concat(), "\r\n");
    let split = with.find("\r\n\r\ndata: [DONE]").unwrap() + 3;
    assert_eq!(
        run_filter(with.as_bytes(), &[split, split]),
        without.as_bytes()
    );
}
