//! The default transport's body: gathered whole from any number of chunks,
//! refused once it passes the byte cap even without a `Content-Length`.
use axum::body::Body;
use axum::routing::get;
use fanout_budget::{ReadError, HttpTransport, Read, Transport};

/// `n` chunks of `size` bytes each (chunk `i` is all `b'a' + i`), streamed
/// without a `Content-Length`.
fn streamed(n: u8, size: usize) -> Body {
    let chunks = (0..n).map(move |i| Ok::<_, std::io::Error>(vec![b'a' + i; size]));
    Body::from_stream(futures::stream::iter(chunks))
}

async fn serve() -> String {
    let app = axum::Router::new()
        .route("/one", get(|| async { "just one chunk" }))
        .route("/many", get(|| async { streamed(4, 50_000) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

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
    let base = serve().await;
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
    let base = serve().await;
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
