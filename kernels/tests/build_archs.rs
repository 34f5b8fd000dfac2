//! The build script's COMMSTACK_CUDA_ARCHS parsing (build_archs.rs), tested here because a
//! build script's own tests never run.

#[path = "../build_archs.rs"]
mod archs;

use archs::{gencode, parse_archs};

/// The entries every place pins (commstack_stack::arch), as nvcc flags.
#[test]
fn archs_parse_through_the_stack_grammar() {
    let archs = parse_archs(Some("90;90a,100f 90-real;90")).unwrap();
    let entries: Vec<String> = archs.iter().map(|a| a.cmake()).collect();
    assert_eq!(entries, ["90", "90a", "100f", "90-real"]);
    let flags: Vec<String> = archs.iter().map(gencode).collect();
    assert_eq!(
        flags,
        [
            "arch=compute_90,code=sm_90",
            "arch=compute_90a,code=sm_90a",
            "arch=compute_100f,code=sm_100f",
            "arch=compute_90,code=sm_90",
        ]
    );
    assert_eq!(
        gencode(&"120-virtual".parse().unwrap()),
        "arch=compute_120,code=compute_120"
    );
    assert_eq!(parse_archs(None).unwrap(), parse_archs(Some("90")).unwrap());
    let e = parse_archs(Some("90;9x0")).unwrap_err();
    assert!(e.contains("\"9x0\" is not a CUDA architecture"), "{e}");
}
