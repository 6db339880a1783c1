//! With RSHMEM_FABRIC_LIB pointing at a file that does not exist, every entry point
//! returns Error::LibraryMissing naming the file and the package — never a panic.
//! (Its own test binary: the library table is loaded once per process.)

#[test]
fn missing_library_is_a_clear_error() {
    let bogus = "/nonexistent/rshmem-test/libfabric.so.1";
    std::env::set_var(rshmem::fabric::loader::LIB_ENV, bogus);
    let e = rshmem::fabric::Fabric::open(&rshmem::fabric::FabricConfig::default()).unwrap_err();
    let text = e.to_string();
    match &e {
        rshmem::Error::LibraryMissing {
            library, package, ..
        } => {
            assert_eq!(library, bogus);
            assert_eq!(package, "libfabric1");
        }
        other => panic!("expected LibraryMissing, got {other:?}"),
    }
    assert!(
        text.contains(bogus)
            && text.contains("install libfabric1")
            && text.contains("RSHMEM_FABRIC_LIB"),
        "{text}"
    );
    // Same answer the second time (the failure is remembered, not a panic).
    assert!(rshmem::fabric::version().is_err());
}
