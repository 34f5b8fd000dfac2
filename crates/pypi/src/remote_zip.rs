//! Read one file out of a remote zip (a wheel) with HTTP range requests, so that a wheel's
//! METADATA costs a few kilobytes instead of the whole wheel (torch's is 530 MB). The zip
//! crate does the parsing; this is only a `Read + Seek` over ranges, fetched in blocks.

use std::collections::HashMap;
use std::io::{self, Read, Seek, SeekFrom};

use anyhow::{Context, Result, bail};
use tokio::runtime::Handle;

const BLOCK: u64 = 256 * 1024;

/// Must be used from a blocking thread (`spawn_blocking`): every read may wait on the network.
pub struct RangeReader {
    client: reqwest::Client,
    url: String,
    len: u64,
    pos: u64,
    blocks: HashMap<u64, Vec<u8>>,
    handle: Handle,
    /// Set when the server ignored Range and sent the whole file.
    whole: Option<Vec<u8>>,
    pub bytes_fetched: u64,
}

impl RangeReader {
    pub fn open(client: reqwest::Client, url: &str, handle: Handle) -> Result<RangeReader> {
        // The last block, which also tells the total length (Content-Range: bytes a-b/len).
        let resp = handle
            .block_on(
                client
                    .get(url)
                    .header(reqwest::header::RANGE, format!("bytes=-{BLOCK}"))
                    .send(),
            )
            .with_context(|| format!("GET {url} (range)"))?;
        let status = resp.status();
        if status == reqwest::StatusCode::PARTIAL_CONTENT {
            let total = resp
                .headers()
                .get(reqwest::header::CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.rsplit('/').next())
                .and_then(|v| v.parse::<u64>().ok())
                .with_context(|| format!("{url}: 206 without a usable Content-Range"))?;
            let body = handle
                .block_on(resp.bytes())
                .with_context(|| format!("reading {url}"))?
                .to_vec();
            let start = total - body.len() as u64;
            let mut reader = RangeReader {
                client,
                url: url.to_string(),
                len: total,
                pos: 0,
                blocks: HashMap::new(),
                handle,
                whole: None,
                bytes_fetched: body.len() as u64,
            };
            reader.store(start, body);
            Ok(reader)
        } else if status.is_success() {
            // No range support: we have to take the whole file.
            let body = handle
                .block_on(resp.bytes())
                .with_context(|| format!("reading {url}"))?
                .to_vec();
            Ok(RangeReader {
                client,
                url: url.to_string(),
                len: body.len() as u64,
                pos: 0,
                blocks: HashMap::new(),
                handle,
                bytes_fetched: body.len() as u64,
                whole: Some(body),
            })
        } else {
            bail!("GET {url} answered {status}")
        }
    }

    /// Keep a fetched range as whole aligned blocks (a partial first block is refetched).
    fn store(&mut self, start: u64, data: Vec<u8>) {
        let mut offset = start;
        let mut rest = &data[..];
        while !rest.is_empty() {
            let block = offset / BLOCK;
            let block_start = block * BLOCK;
            let block_end = (block_start + BLOCK).min(self.len);
            let take = ((block_end - offset) as usize).min(rest.len());
            if offset == block_start && take as u64 == block_end - block_start {
                self.blocks.insert(block, rest[..take].to_vec());
            }
            offset += take as u64;
            rest = &rest[take..];
        }
    }

    fn block(&mut self, index: u64) -> io::Result<&[u8]> {
        if !self.blocks.contains_key(&index) {
            let start = index * BLOCK;
            let end = (start + BLOCK).min(self.len) - 1;
            let fetch = async {
                let resp = self
                    .client
                    .get(&self.url)
                    .header(reqwest::header::RANGE, format!("bytes={start}-{end}"))
                    .send()
                    .await?
                    .error_for_status()?;
                if resp.status() != reqwest::StatusCode::PARTIAL_CONTENT {
                    return Err(anyhow::anyhow!(
                        "server stopped honouring Range ({})",
                        resp.status()
                    ));
                }
                Ok(resp.bytes().await?.to_vec())
            };
            let data = self.handle.block_on(fetch).map_err(|e| {
                io::Error::other(format!("{}: bytes {start}-{end}: {e:#}", self.url))
            })?;
            if data.len() as u64 != end - start + 1 {
                return Err(io::Error::other(format!(
                    "{}: short range read at {start}",
                    self.url
                )));
            }
            self.bytes_fetched += data.len() as u64;
            self.blocks.insert(index, data);
        }
        Ok(&self.blocks[&index])
    }
}

impl Read for RangeReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.len || buf.is_empty() {
            return Ok(0);
        }
        if let Some(whole) = &self.whole {
            let n = buf.len().min((self.len - self.pos) as usize);
            buf[..n].copy_from_slice(&whole[self.pos as usize..self.pos as usize + n]);
            self.pos += n as u64;
            return Ok(n);
        }
        let index = self.pos / BLOCK;
        let within = (self.pos - index * BLOCK) as usize;
        let pos = self.pos;
        let block = self.block(index)?;
        let n = buf.len().min(block.len() - within);
        buf[..n].copy_from_slice(&block[within..within + n]);
        self.pos = pos + n as u64;
        Ok(n)
    }
}

impl Seek for RangeReader {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let new = match to {
            SeekFrom::Start(n) => n as i128,
            SeekFrom::End(d) => self.len as i128 + d as i128,
            SeekFrom::Current(d) => self.pos as i128 + d as i128,
        };
        if new < 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek before the start",
            ));
        }
        self.pos = new as u64;
        Ok(self.pos)
    }
}

/// METADATA of the wheel at `url`, read through range requests.
pub fn wheel_metadata(
    client: reqwest::Client,
    url: &str,
    handle: Handle,
) -> Result<(Vec<u8>, u64)> {
    let reader = RangeReader::open(client, url, handle)?;
    let mut zip = zip::ZipArchive::new(reader).with_context(|| format!("{url}: not a zip file"))?;
    let name = (0..zip.len())
        .filter_map(|i| zip.name_for_index(i).and_then(|n| n.ok()).map(|n| n.into_owned()))
        .find(|n| {
            let mut parts = n.split('/');
            matches!((parts.next(), parts.next(), parts.next()), (Some(d), Some("METADATA"), None) if d.ends_with(".dist-info"))
        })
        .with_context(|| format!("{url}: the wheel has no *.dist-info/METADATA"))?;
    let mut file = zip
        .by_name(&name)
        .with_context(|| format!("{url}: reading {name}"))?;
    let mut out = Vec::new();
    file.read_to_end(&mut out)
        .with_context(|| format!("{url}: reading {name}"))?;
    drop(file);
    let fetched = zip.into_inner().bytes_fetched;
    Ok((out, fetched))
}

/// The names in the zip directory of the wheel at `url` (every file it would install),
/// read through range requests: the central directory only, not the files.
pub fn wheel_file_names(
    client: reqwest::Client,
    url: &str,
    handle: Handle,
) -> Result<(Vec<String>, u64)> {
    let reader = RangeReader::open(client, url, handle)?;
    let zip = zip::ZipArchive::new(reader).with_context(|| format!("{url}: not a zip file"))?;
    let names = zip
        .file_names()
        .map(|n| n.map(|n| n.into_owned()))
        .collect::<Result<Vec<String>, _>>()
        .with_context(|| format!("{url}: a file name in the zip directory"))?;
    Ok((names, zip.into_inner().bytes_fetched))
}
