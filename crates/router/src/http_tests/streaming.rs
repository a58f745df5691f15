//! Streams pass through chunk by chunk; a worker that fails once the head
//! is out ends the stream with an error event and `[DONE]`, never a retry.

use axum::http::{header, StatusCode};
use bytes::Bytes;

use super::harness::{header_of, metric, next_chunk, round_robin, worker_of, FakeWorker};
use crate::metrics as m;

const ROLE: &str =
    "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
const TOKEN: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";

#[tokio::test(start_paused = true)]
async fn sse_chunks_pass_through_one_at_a_time() {
    let (a, feed) = FakeWorker::streaming("sse-a");
    let r = round_robin(&[&a], "").await;
    feed.send(Ok(Bytes::from(ROLE))).expect("feed");
    let resp = r.chat(true).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        header_of(&resp, header::CONTENT_TYPE.as_str()),
        Some("text/event-stream")
    );
    assert_eq!(worker_of(&resp), a.url);
    let mut body = resp.into_body();
    // Each chunk comes out before the worker writes the next one.
    assert_eq!(
        next_chunk(&mut body).await.as_deref(),
        Some(ROLE.as_bytes())
    );
    feed.send(Ok(Bytes::from(TOKEN))).expect("feed");
    assert_eq!(
        next_chunk(&mut body).await.as_deref(),
        Some(TOKEN.as_bytes())
    );
    feed.send(Ok(Bytes::from("data: [DONE]\n\n")))
        .expect("feed");
    assert_eq!(
        next_chunk(&mut body).await.as_deref(),
        Some(&b"data: [DONE]\n\n"[..])
    );
    drop(feed);
    assert_eq!(next_chunk(&mut body).await, None);
    assert_eq!(r.worker_status(&a.url).await["outstanding"], 0);
}

#[tokio::test(start_paused = true)]
async fn a_worker_failing_mid_stream_ends_it_with_an_error_event_and_no_retry() {
    let (a, feed) = FakeWorker::streaming("midfail-a");
    let b = FakeWorker::ok("midfail-b");
    let r = round_robin(&[&a, &b], "").await;
    feed.send(Ok(Bytes::from(TOKEN))).expect("feed");
    let resp = r.chat(true).await;
    assert_eq!(worker_of(&resp), a.url);
    let mut body = resp.into_body();
    assert_eq!(
        next_chunk(&mut body).await.as_deref(),
        Some(TOKEN.as_bytes())
    );
    feed.send(Err(std::io::Error::other("killed")))
        .expect("feed");
    let end = next_chunk(&mut body).await.expect("an error event");
    let text = String::from_utf8_lossy(&end);
    assert!(
        text.contains("\"code\":\"worker_failed_mid_stream\""),
        "{text}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(next_chunk(&mut body).await, None);
    assert_eq!(b.posts(), 0, "tokens were sent: never retried");
    assert_eq!(metric(m::INTERRUPTED, &[("worker", a.url.as_str())]), 1.0);
    assert_eq!(r.worker_status(&a.url).await["healthy"], false);
}
