//! DeepEP V2's JIT in the loaded image, with no GPU and no network, as the image user:
//! what it runs and reads before any kernel launch (docs/deepep-v2.md). nvcc and the host
//! g++ compile a kernel that includes the CUDA headers V2's kernels use and NCCL's
//! (`-I <nccl root>/include -I <deep_ep>/include`, sm_90a, C++20, as the JIT's flags)
//! into EP_JIT_CACHE_DIR's tmp/, and cuobjdump lists its entry in the format the JIT
//! parses (`STT_FUNC ... STO_ENTRY`); the NCCL root find_nccl_root() gives holds the
//! headers and the library V2's check_nccl_so compares; DeepEP's include tree is there.

use std::path::Path;

use anyhow::{Context, Result};
use commstack_image::Image;

use crate::flow::in_image::{keep_output, python_without_gpu};

/// The check's Python (the image's venv runs it; deep_ep itself is not imported: its
/// extension needs the driver's libcuda.so.1).
const SCRIPT: &str = r#"
import glob, importlib.util, json, os, shutil, subprocess, sysconfig
site = sysconfig.get_paths()['purelib']
home, cache = os.environ['CUDA_HOME'], os.environ['EP_JIT_CACHE_DIR']
out = {'CUDA_HOME': home, 'EP_JIT_CACHE_DIR': cache}
def run(argv, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if r.returncode:
        raise SystemExit('FAILED: %s (exit %d)\n%s%s' % (' '.join(argv), r.returncode, r.stdout, r.stderr))
    return r.stdout
out['nvcc'] = [l for l in run([home + '/bin/nvcc', '--version']).splitlines() if 'release' in l][0]
out['gcc'] = run(['gcc', '--version']).splitlines()[0]
out['g++'] = run(['g++', '--version']).splitlines()[0]
spec = importlib.util.spec_from_file_location('find_pkgs', os.path.join(site, 'deep_ep', 'utils', 'find_pkgs.py'))
find_pkgs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(find_pkgs)
nccl = find_pkgs.find_nccl_root()
out['nccl_root'] = nccl
for f in ['include/nccl.h', 'include/nccl_device.h']:
    if not os.path.isfile(os.path.join(nccl, f)):
        raise SystemExit('FAILED: the NCCL root %s has no %s (V2 kernels include it)' % (nccl, f))
libs = sorted(glob.glob(nccl + '/lib/libnccl.so*'))
if not libs:
    raise SystemExit('FAILED: the NCCL root %s has no lib/libnccl.so* (check_nccl_so compares it)' % nccl)
out['nccl_lib'] = libs[0]
include = os.path.join(site, 'deep_ep', 'include')
if not os.path.isdir(os.path.join(include, 'deep_ep')):
    raise SystemExit('FAILED: no %s/deep_ep: DeepEP V2 compiles its kernels from that tree' % include)
tmp = os.path.join(cache, 'tmp', 'commstack-check')
os.makedirs(tmp, exist_ok=True)
src = os.path.join(tmp, 'kernel.cu')
with open(src, 'w') as f:
    f.write('#include <cuda_runtime.h>\n#include <cuda_bf16.h>\n#include <cuda_fp8.h>\n'
            '#include <cooperative_groups.h>\n#include <nccl.h>\n#include <nccl_device.h>\n'
            'extern "C" __global__ void commstack_probe(int *p) { *p = NCCL_MAJOR; }\n')
run([home + '/bin/nvcc', src, '-cubin', '-o', os.path.join(tmp, 'kernel.cubin'), '-std=c++20',
     '-I' + nccl + '/include', '-I' + include, '--gpu-architecture=sm_90a', '-O3'], cwd=tmp)
symbols = run([home + '/bin/cuobjdump', '-symbols', os.path.join(tmp, 'kernel.cubin')])
entry = [l for l in symbols.splitlines() if l.startswith('STT_FUNC') and 'STO_ENTRY' in l and 'commstack_probe' in l]
if not entry:
    raise SystemExit('FAILED: cuobjdump -symbols lists no "STT_FUNC ... STO_ENTRY commstack_probe" line, the format DeepEP V2 parses:\n' + symbols)
out['cuobjdump'] = ' '.join(entry[0].split())
shutil.rmtree(tmp)
print(json.dumps(out))
"#;

/// Runs the check in `image` (no GPU, no network, the image's user); its output goes to
/// `jit-toolchain.txt` in `report_dir`. True when it passed.
pub fn jit_toolchain_in_image(
    image: &Image,
    report_dir: &Path,
    say: &dyn Fn(&str),
) -> Result<bool> {
    let out = python_without_gpu(image, SCRIPT)
        .output()
        .context("cannot run `docker run` (DeepEP V2's JIT toolchain)")?;
    let file = report_dir.join("jit-toolchain.txt");
    let text = keep_output(&out, &file)?;
    let ok = out.status.success();
    say(&format!(
        "DeepEP V2's JIT toolchain (nvcc, g++, cuobjdump, NCCL root, include tree; no GPU): {} {}",
        if ok { "passed" } else { "FAILED" },
        text.lines().last().unwrap_or("").trim()
    ));
    if !ok {
        say(&format!("  output: {}", file.display()));
    }
    Ok(ok)
}
