//! Pushing a [`Store`]'s repositories into a real registry through the OCI
//! push API (blob upload + manifest PUT).

use fanout_gateway::embedded::Store;

/// Pushes every blob, then every manifest (images before indexes), then
/// the tags, of `store` through the OCI push API.
pub async fn push(base: &str, store: &Store) {
    push_with(&reqwest::Client::new(), base, store).await;
}

/// [`push`] with `client` (one that trusts a test CA, say).
pub async fn push_with(client: &reqwest::Client, base: &str, store: &Store) {
    for (name, repo) in &store.repos {
        for (digest, blob) in &repo.blobs {
            let start = client
                .post(format!("{base}/v2/{name}/blobs/uploads/"))
                .send()
                .await
                .unwrap();
            assert_eq!(start.status(), 202, "upload start for {name}");
            let location = start.headers()["location"].to_str().unwrap().to_string();
            let location = if location.starts_with("http") {
                location
            } else {
                format!("{base}{location}")
            };
            let sep = if location.contains('?') { '&' } else { '?' };
            let put = client
                .put(format!("{location}{sep}digest={digest}"))
                .header("content-type", "application/octet-stream")
                .body(blob.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(
                put.status(),
                201,
                "blob {digest}: {}",
                put.text().await.unwrap()
            );
        }
        // Images before the indexes that reference them.
        let mut order: Vec<&String> = repo.manifests.keys().collect();
        order.sort_by_key(|d| repo.manifests[*d].media_type.contains("index"));
        for digest in order {
            put_manifest(client, base, name, digest, &repo.manifests[digest]).await;
        }
        for (tag, digest) in &repo.tags {
            put_manifest(client, base, name, tag, &repo.manifests[digest]).await;
        }
    }
}

/// `PUT /v2/<name>/manifests/<reference>` with the manifest's own media type.
async fn put_manifest(
    client: &reqwest::Client,
    base: &str,
    name: &str,
    reference: &str,
    manifest: &fanout_gateway::embedded::store::StoredManifest,
) {
    let put = client
        .put(format!("{base}/v2/{name}/manifests/{reference}"))
        .header("content-type", &manifest.media_type)
        .body(manifest.body.clone())
        .send()
        .await
        .unwrap();
    let status = put.status();
    assert_eq!(
        status,
        201,
        "manifest {reference}: {}",
        put.text().await.unwrap()
    );
}
