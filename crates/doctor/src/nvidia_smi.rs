//! nvidia-smi: run live, or read recorded output, and parse what the checks need.
//!
//! Recorded directory layout (what `--nvidia-smi-dir` reads):
//!   nvidia-smi.txt         `nvidia-smi`
//!   nvidia-smi-query.csv   `nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id,memory.total --format=csv`
//!   nvidia-smi-topo-m.txt  `nvidia-smi topo -m`
//!   nvidia-smi-compute-cap.csv  `nvidia-smi --query-gpu=index,compute_cap --format=csv`
//!                          (the preflight's GPU-arch check; a query of its own, since
//!                          drivers before 510 refuse the field and with it the whole query)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The query the doctor runs (and that a recorded `nvidia-smi-query.csv` should come from).
pub const QUERY_ARGS: [&str; 2] = [
    "--query-gpu=index,name,driver_version,pci.bus_id,memory.total",
    "--format=csv",
];

/// The compute capability query the preflight runs (`nvidia-smi-compute-cap.csv` recorded).
pub const COMPUTE_CAP_ARGS: [&str; 2] = ["--query-gpu=index,compute_cap", "--format=csv"];

/// Where nvidia-smi output comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvidiaSmiSource {
    /// Run `nvidia-smi` from PATH.
    Live,
    /// Read the files a previous run recorded.
    Recorded(PathBuf),
}

impl NvidiaSmiSource {
    pub fn describe(&self) -> String {
        match self {
            NvidiaSmiSource::Live => "live".into(),
            NvidiaSmiSource::Recorded(dir) => format!("recorded in {}", dir.display()),
        }
    }
}

/// The three outputs, each either text or why it is missing.
#[derive(Debug, Clone)]
pub struct NvidiaSmiOutput {
    /// Set when nvidia-smi does not exist at all: every GPU check reports this.
    pub absent: Option<String>,
    pub summary: Result<String, String>,
    pub query_csv: Result<String, String>,
    pub topo: Result<String, String>,
    /// `index, compute_cap` per GPU ([`COMPUTE_CAP_ARGS`]).
    pub compute_cap: Result<String, String>,
}

impl NvidiaSmiOutput {
    pub fn collect(source: &NvidiaSmiSource, path_var: Option<&str>) -> NvidiaSmiOutput {
        match source {
            NvidiaSmiSource::Recorded(dir) => NvidiaSmiOutput {
                absent: None,
                summary: recorded(dir, "nvidia-smi.txt"),
                query_csv: recorded(dir, "nvidia-smi-query.csv"),
                topo: recorded(dir, "nvidia-smi-topo-m.txt"),
                compute_cap: recorded(dir, "nvidia-smi-compute-cap.csv"),
            },
            NvidiaSmiSource::Live => match find_on_path("nvidia-smi", path_var) {
                None => {
                    let why = "no nvidia-smi: no NVIDIA driver on this host".to_string();
                    NvidiaSmiOutput {
                        absent: Some(why.clone()),
                        summary: Err(why.clone()),
                        query_csv: Err(why.clone()),
                        topo: Err(why.clone()),
                        compute_cap: Err(why),
                    }
                }
                Some(exe) => NvidiaSmiOutput {
                    absent: None,
                    summary: run(&exe, &[]),
                    query_csv: run(&exe, &QUERY_ARGS),
                    topo: run(&exe, &["topo", "-m"]),
                    compute_cap: run(&exe, &COMPUTE_CAP_ARGS),
                },
            },
        }
    }
}

fn recorded(dir: &Path, name: &str) -> Result<String, String> {
    let path = dir.join(name);
    std::fs::read(&path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .map_err(|e| format!("no recorded {}: {e}", path.display()))
}

/// `exe args...`'s stdout; its failure in words. nvidia-smi prints "NVIDIA-SMI has failed
/// because it couldn't communicate with the NVIDIA driver..." on stdout when the kernel
/// module is not loaded: the failure's lines are stdout's when stderr is empty.
fn run(exe: &Path, args: &[&str]) -> Result<String, String> {
    let mut command = std::process::Command::new(exe);
    command.args(args);
    commstack_exec::output("nvidia-smi", &mut command)
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .map_err(|e| match commstack_exec::CommandFailed::in_chain(&e) {
            Some(failed) => failed.one_line(),
            None => format!("{e:#}"),
        })
}

fn find_on_path(name: &str, path_var: Option<&str>) -> Option<PathBuf> {
    path_var?
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// The driver and the newest CUDA it supports, from the `nvidia-smi` banner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Banner {
    pub driver: Option<String>,
    pub cuda: Option<String>,
}

pub fn parse_banner(text: &str) -> Banner {
    let value_after = |label: &str| {
        let at = text.find(label)? + label.len();
        text[at..].split_whitespace().next().map(str::to_string)
    };
    Banner {
        driver: value_after("Driver Version:"),
        cuda: value_after("CUDA Version:"),
    }
}

/// One GPU row of the query CSV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuRow {
    pub index: Option<u32>,
    pub name: String,
    pub driver_version: Option<String>,
    pub pci_bus_id: Option<String>,
    pub memory_total: Option<String>,
}

/// Parse `nvidia-smi --query-gpu=... --format=csv` by its header, in any column order.
pub fn parse_query_csv(text: &str) -> Result<Vec<GpuRow>, String> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = lines.next().ok_or("empty nvidia-smi query output")?;
    // "memory.total [MiB]" -> "memory.total"
    let columns: Vec<String> = header
        .split(',')
        .map(|c| c.split('[').next().unwrap_or("").trim().to_string())
        .collect();
    let col = |name: &str| columns.iter().position(|c| c == name);
    let name_col =
        col("name").ok_or_else(|| format!("no `name` column in the query header: {header:?}"))?;
    let mut rows = Vec::new();
    for line in lines {
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        if cells.len() != columns.len() {
            return Err(format!(
                "query row has {} fields, header has {}: {line:?}",
                cells.len(),
                columns.len()
            ));
        }
        let get = |c: Option<usize>| {
            c.map(|i| cells[i])
                .filter(|v| !v.starts_with('['))
                .map(str::to_string)
        };
        rows.push(GpuRow {
            index: get(col("index")).and_then(|v| v.parse().ok()),
            name: cells[name_col].to_string(),
            driver_version: get(col("driver_version")),
            pci_bus_id: get(col("pci.bus_id")),
            memory_total: get(col("memory.total")),
        });
    }
    Ok(rows)
}

/// One GPU's index and compute capability `(major, minor)`.
pub type ComputeCap = (u32, (u32, u32));

/// `nvidia-smi --query-gpu=index,compute_cap --format=csv`: (index, (major, minor)) per GPU.
pub fn parse_compute_caps(text: &str) -> Result<Vec<ComputeCap>, String> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = lines.next().ok_or("empty nvidia-smi compute_cap output")?;
    let columns: Vec<&str> = header.split(',').map(str::trim).collect();
    let (Some(index), Some(cap)) = (
        columns.iter().position(|c| *c == "index"),
        columns.iter().position(|c| *c == "compute_cap"),
    ) else {
        return Err(format!(
            "no `index` and `compute_cap` columns in the header {header:?}"
        ));
    };
    lines
        .map(|line| {
            let cells: Vec<&str> = line.split(',').map(str::trim).collect();
            let parsed = (|| {
                let i: u32 = cells.get(index)?.parse().ok()?;
                let (major, minor) = cells.get(cap)?.split_once('.')?;
                Some((i, (major.parse().ok()?, minor.parse().ok()?)))
            })();
            parsed.ok_or_else(|| format!("not an `index, compute_cap` row: {line:?}"))
        })
        .collect()
}

/// The link matrix of `nvidia-smi topo -m`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Topology {
    /// Column labels in order: `GPU0`, ..., `NIC0`, ...
    pub devices: Vec<String>,
    /// (row, column) -> `X`, `NV18`, `SYS`, `NODE`, `PHB`, `PXB`, `PIX`.
    pub links: BTreeMap<(String, String), String>,
    /// `NIC0` -> `mlx5_0`, from the NIC Legend.
    pub nic_names: BTreeMap<String, String>,
}

impl Topology {
    pub fn gpus(&self) -> Vec<&str> {
        self.devices
            .iter()
            .filter(|d| d.starts_with("GPU"))
            .map(String::as_str)
            .collect()
    }

    pub fn link(&self, a: &str, b: &str) -> Option<&str> {
        self.links
            .get(&(a.to_string(), b.to_string()))
            .map(String::as_str)
    }
}

/// Parse `nvidia-smi topo -m`, tab- or space-separated, with or without terminal escapes.
pub fn parse_topology(text: &str) -> Result<Topology, String> {
    let text = strip_ansi(text);
    let is_device = |t: &str| {
        (t.starts_with("GPU") || t.starts_with("NIC"))
            && t.len() > 3
            && t[3..].bytes().all(|b| b.is_ascii_digit())
    };
    let mut topo = Topology::default();
    let mut in_nic_legend = false;
    for line in text.lines() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        if tokens.is_empty() {
            continue;
        }
        if topo.devices.is_empty() {
            // The header is the first indented line naming devices; rows start at column 0.
            if line.starts_with(char::is_whitespace) && tokens.iter().any(|t| is_device(t)) {
                topo.devices = tokens
                    .iter()
                    .filter(|t| is_device(t))
                    .map(|t| t.to_string())
                    .collect();
            }
            continue;
        }
        if line.trim_start().starts_with("NIC Legend") {
            in_nic_legend = true;
            continue;
        }
        if in_nic_legend {
            if let Some((nic, name)) = line.trim().split_once(':') {
                topo.nic_names
                    .insert(nic.trim().to_string(), name.trim().to_string());
            }
            continue;
        }
        if is_device(tokens[0]) && tokens.len() > topo.devices.len() {
            let row = tokens[0];
            for (column, cell) in topo.devices.iter().zip(&tokens[1..]) {
                topo.links
                    .insert((row.to_string(), column.clone()), cell.to_string());
            }
        }
    }
    if topo.devices.is_empty() {
        return Err("no GPU column header in the `nvidia-smi topo -m` output".into());
    }
    for gpu in topo.gpus() {
        if topo.link(gpu, gpu).is_none() {
            return Err(format!(
                "no row for {gpu} in the `nvidia-smi topo -m` output"
            ));
        }
    }
    Ok(topo)
}

/// nvidia-smi underlines the header on a terminal (`ESC[4m ... ESC[0m`), also when recorded.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn banner_of_a_580_driver() {
        let b = parse_banner(
            "| NVIDIA-SMI 580.159.03             Driver Version: 580.159.03     CUDA Version: 13.0     |",
        );
        assert_eq!(
            b,
            Banner {
                driver: Some("580.159.03".into()),
                cuda: Some("13.0".into())
            }
        );
    }

    #[test]
    fn query_csv_in_any_order_with_units() {
        let rows = parse_query_csv(
            "name, driver_version, memory.total [MiB], compute_cap\nNVIDIA H100 80GB HBM3, 580.82.07, 81559 MiB, 9.0\n",
        )
        .unwrap();
        assert_eq!(rows[0].name, "NVIDIA H100 80GB HBM3");
        assert_eq!(rows[0].driver_version.as_deref(), Some("580.82.07"));
        assert_eq!(rows[0].memory_total.as_deref(), Some("81559 MiB"));
        assert_eq!(rows[0].index, None);
        assert!(
            parse_query_csv("index, driver_version\n0, 580\n")
                .unwrap_err()
                .contains("no `name` column")
        );
    }

    #[test]
    fn topology_with_escapes_and_spaces() {
        let text = "\t\u{1b}[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\u{1b}[0m\n\
                    GPU0\t X \tNV12\t0-23\t0\t\tN/A\nGPU1\tNV12\t X \t0-23\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n";
        let t = parse_topology(text).unwrap();
        assert_eq!(t.devices, ["GPU0", "GPU1"]);
        assert_eq!(t.link("GPU0", "GPU1"), Some("NV12"));
        assert_eq!(t.link("GPU1", "GPU1"), Some("X"));
        assert!(parse_topology("nothing here").is_err());
    }
}
