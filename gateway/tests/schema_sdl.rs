//! `schema/registry.graphql` is the schema the code serves.
//! Run with `UPDATE_SCHEMA=1` to rewrite the file from the code.

#[test]
fn the_sdl_file_matches_the_code() {
    let schema = fanout_gateway::schema::builder().finish();
    let sdl = schema.sdl();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../schema/registry.graphql");
    if std::env::var("UPDATE_SCHEMA").as_deref() == Ok("1") {
        std::fs::write(&path, &sdl).unwrap();
    }
    let file = std::fs::read_to_string(&path).expect("schema/registry.graphql exists");
    assert_eq!(
        file.trim(),
        sdl.trim(),
        "schema/registry.graphql drifted from the code; rerun with UPDATE_SCHEMA=1"
    );
}

#[test]
fn the_sdl_has_the_contract_shape() {
    let sdl = fanout_gateway::schema::builder().finish().sdl();
    for line in [
        "repository(name: String!): Repository",
        "repositories(first: Int! = 20, after: String): RepositoryConnection!",
        "fanoutBudget: FanoutBudget!",
        "fanoutQuota: FanoutQuota",
        "tags(first: Int! = 20, after: String): TagConnection!",
        "tag(name: String!): Tag",
        "manifest: Manifest",
        "config: ImageConfig",
        "size: Bytes!",
        "totalCount: Int!",
        "scalar Bytes",
    ] {
        assert!(sdl.contains(line), "missing `{line}` in:\n{sdl}");
    }
}
