//! The default transport's body: gathered whole from any number of chunks,
//! refused once it passes the byte cap even without a `Content-Length`.
//! (The testkit upstream's `/one`: one chunk; `/many`: four of 50,000 bytes,
//! chunk `i` all `b'a' + i`, without a `Content-Length`.)
use fanout_budget::{
    read::{HttpTransport, Transport},
    Read, ReadError,
};
use fanout_testkit::Upstream;

async fn fetch(base: &str, path: &str, cap: usize) -> Result<bytes::Bytes, ReadError> {
    let transport = HttpTransport::new(reqwest::Client::new(), cap);
    let read = Read::get(format!("{base}{path}").parse().unwrap());
    let host = read.url().authority().to_string();
    let response = transport.fetch(read, &host).await?;
    assert_eq!(response.host, host);
    Ok(response.body)
}

#[tokio::test]
async fn a_body_comes_whole_however_it_is_chunked() {
    let upstream = Upstream::start().await;
    let base = upstream.base();
    assert_eq!(
        &fetch(&base, "/one", 1 << 20).await.unwrap()[..],
        b"just one chunk"
    );
    let body = fetch(&base, "/many", 1 << 20).await.unwrap();
    assert_eq!(body.len(), 200_000);
    for (i, part) in body.chunks(50_000).enumerate() {
        assert!(
            part.iter().all(|b| *b == b'a' + i as u8),
            "chunk {i} out of place"
        );
    }
    // Exactly the cap is allowed.
    assert_eq!(fetch(&base, "/many", 200_000).await.unwrap().len(), 200_000);
}

#[tokio::test]
async fn a_streamed_body_over_the_cap_is_refused() {
    let upstream = Upstream::start().await;
    let base = upstream.base();
    let err = fetch(&base, "/many", 120_000).await.unwrap_err();
    match err {
        ReadError::Upstream {
            status, message, ..
        } => {
            assert_eq!(status, Some(200));
            assert_eq!(message, "response body larger than 120000 bytes");
        }
        other => panic!("expected UPSTREAM_ERROR, got {other:?}"),
    }
}
