//! COMMSTACK_CUDA_ARCHS to nvcc's `-gencode` flags, through the stack's CUDA-arch type.
//! Shared by build.rs and tests/build_archs.rs.

use commstack_stack::CudaArch;

/// "90", "90;100", "90,100a" -> [90] / [90, 100] / [90, 100a], duplicates dropped; empty
/// or unset -> [90]. Each entry parses through the stack's CUDA-arch type.
pub fn parse_archs(value: Option<&str>) -> Result<Vec<CudaArch>, String> {
    let value = value
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .unwrap_or("90");
    let mut archs = Vec::new();
    for item in value
        .split([';', ',', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let arch: CudaArch = item
            .parse()
            .map_err(|e| format!("COMMSTACK_CUDA_ARCHS={value:?}: {e}"))?;
        if !archs.contains(&arch) {
            archs.push(arch);
        }
    }
    Ok(archs)
}

/// The `-gencode` value: SASS for the SM (as before for plain entries, which CMake would
/// also give PTX: the self-test runs on the GPUs it was built for), PTX for `-virtual`.
pub fn gencode(arch: &CudaArch) -> String {
    let code = arch.sass_name().unwrap_or_else(|| arch.ptx_name());
    format!("arch={},code={code}", arch.ptx_name())
}
