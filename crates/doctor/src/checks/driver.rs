//! The NVIDIA driver against the CUDA version the stack is built with.

use super::input::Host;
use crate::nvidia_smi::{parse_banner, parse_query_csv};
use crate::proc_files::kernel_module_version;
use crate::report::{Check, Status};
use crate::version::{CudaVersion, DriverVersion, minimum_driver_major};

const ID: &str = "nvidia-driver";
const TITLE: &str = "NVIDIA driver vs the stack's CUDA";

pub(crate) fn check(host: &Host) -> Check {
    let cuda = host.required_cuda;
    let install = install_fix(cuda);
    let proc_text = match host.fs.read("/proc/driver/nvidia/version") {
        Ok(text) => text,
        Err(e) => {
            return Check::new(
                ID,
                TITLE,
                Status::Fail,
                format!("cannot read /proc/driver/nvidia/version: {e}"),
            )
            .fix("run the doctor as a user that can read /proc/driver/nvidia");
        }
    };
    let kernel_module = proc_text.as_deref().and_then(kernel_module_version);
    let banner = host.smi.summary.as_deref().ok().map(parse_banner);
    let user_space = banner.as_ref().and_then(|b| b.driver.clone()).or_else(|| {
        host.smi
            .query_csv
            .as_deref()
            .ok()
            .and_then(|t| parse_query_csv(t).ok()?.first()?.driver_version.clone())
    });
    let smi_cuda = banner.as_ref().and_then(|b| b.cuda.clone());

    let mut details = Vec::new();
    if let Some(line) = proc_text.as_deref().and_then(|t| t.lines().next()) {
        details.push(format!("/proc/driver/nvidia/version: {}", line.trim()));
    }
    match (&user_space, &smi_cuda) {
        (Some(d), Some(c)) => details.push(format!("nvidia-smi: driver {d}, CUDA {c}")),
        (Some(d), None) => details.push(format!("nvidia-smi: driver {d}")),
        _ => {}
    }

    let Some(text) = kernel_module.clone().or_else(|| user_space.clone()) else {
        let why = host
            .smi
            .absent
            .clone()
            .unwrap_or_else(|| "nvidia-smi gave no driver version".into());
        let finding = if proc_text.is_some() {
            format!("no driver version in /proc/driver/nvidia/version, and {why}")
        } else {
            format!("no NVIDIA kernel module (/proc/driver/nvidia/version missing); {why}")
        };
        return Check::new(ID, TITLE, Status::Fail, finding)
            .fix(install)
            .details(details);
    };
    let driver: DriverVersion = match text.parse() {
        Ok(v) => v,
        Err(e) => {
            return Check::new(ID, TITLE, Status::Fail, format!("{e:#}"))
                .fix(install)
                .details(details);
        }
    };
    if let (Some(k), Some(u)) = (&kernel_module, &user_space)
        && k.parse::<DriverVersion>().ok() != u.parse::<DriverVersion>().ok()
    {
        return Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!("kernel module {k} but user-space driver {u}: upgraded without a reboot (NVML: driver/library version mismatch)"),
        )
        .fix("reboot, or unload and reload the nvidia kernel modules")
        .details(details);
    }
    let Some(minimum) = minimum_driver_major(cuda) else {
        return Check::new(ID, TITLE, Status::Warn, format!("driver {driver}; no known minimum driver for CUDA {cuda}"))
            .fix("extend minimum_driver_major() in crates/doctor/src/version.rs from NVIDIA's compatibility table")
            .details(details);
    };
    if driver.major() < minimum {
        return Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!(
                "driver {driver} is too old for CUDA {cuda}: CUDA {}.x needs driver >= {minimum}",
                cuda.major
            ),
        )
        .fix(install)
        .details(details);
    }
    if let Some(max) = smi_cuda
        .as_deref()
        .and_then(|c| c.parse::<CudaVersion>().ok())
        && max < cuda
    {
        return Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!(
                "driver {driver} supports CUDA up to {max} (nvidia-smi), the stack needs {cuda}"
            ),
        )
        .fix(install)
        .details(details);
    }
    Check::new(
        ID,
        TITLE,
        Status::Pass,
        format!(
            "driver {driver} runs CUDA {cuda} (CUDA {}.x needs >= {minimum})",
            cuda.major
        ),
    )
    .details(details)
}

fn install_fix(cuda: CudaVersion) -> String {
    match minimum_driver_major(cuda) {
        Some(m) => format!(
            "install an NVIDIA data-center driver >= {m} (CUDA {}.x) and reboot",
            cuda.major
        ),
        None => format!("install an NVIDIA driver that supports CUDA {cuda}"),
    }
}
