//! Registry credentials: `COMMSTACK_REGISTRY_USER` / `COMMSTACK_REGISTRY_PASSWORD` first,
//! then the `auths` of Docker's config file (`$DOCKER_CONFIG/config.json`, else
//! `~/.docker/config.json`: what `docker login` writes), else anonymous. With a user and
//! password oci-client answers both kinds of challenge: HTTP basic, and the bearer token
//! dance (the password is sent to the token realm, the token to the registry).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use base64::Engine as _;
use oci_client::secrets::RegistryAuth;

pub const USER_ENV: &str = "COMMSTACK_REGISTRY_USER";
pub const PASSWORD_ENV: &str = "COMMSTACK_REGISTRY_PASSWORD";

/// Credentials, and where they came from (for error messages; never the secret).
#[derive(Clone, Debug)]
pub struct Credentials {
    pub auth: RegistryAuth,
    pub source: String,
}

/// The credentials for `registry` (`host[:port]`) from this process's environment and
/// Docker's config file.
pub fn credentials(registry: &str) -> Result<Credentials> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let config_dir = env("DOCKER_CONFIG")
        .map(PathBuf::from)
        .or_else(|| dirs_home().map(|h| h.join(".docker")));
    credentials_from(registry, &env, config_dir.as_deref())
}

fn dirs_home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// [`credentials`] with the environment and Docker's config directory given.
pub fn credentials_from(
    registry: &str,
    env: &dyn Fn(&str) -> Option<String>,
    docker_config_dir: Option<&Path>,
) -> Result<Credentials> {
    match (env(USER_ENV), env(PASSWORD_ENV)) {
        (Some(user), Some(password)) => {
            return Ok(Credentials {
                auth: RegistryAuth::Basic(user, password),
                source: format!("${USER_ENV} and ${PASSWORD_ENV}"),
            });
        }
        (Some(_), None) | (None, Some(_)) => anyhow::bail!(
            "only one of ${USER_ENV} and ${PASSWORD_ENV} is set: set both, or neither to use Docker's config file"
        ),
        (None, None) => {}
    }
    if let Some(dir) = docker_config_dir {
        let file = dir.join("config.json");
        if file.exists()
            && let Some(auth) = from_docker_config(&file, registry)?
        {
            return Ok(Credentials {
                auth,
                source: format!("{}'s auths entry for {registry}", file.display()),
            });
        }
    }
    Ok(Credentials {
        auth: RegistryAuth::Anonymous,
        source: "none (anonymous)".to_string(),
    })
}

/// The `auths` entry of a Docker config file for `registry`: keys may carry a scheme and
/// a path (`https://host:5000/v1/`), as older `docker login` wrote them.
fn from_docker_config(file: &Path, registry: &str) -> Result<Option<RegistryAuth>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read Docker's config file {}", file.display()))?;
    let config: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
    let host_of = |key: &str| -> String {
        let key = key
            .strip_prefix("https://")
            .or_else(|| key.strip_prefix("http://"))
            .unwrap_or(key);
        key.split('/').next().unwrap_or(key).to_string()
    };
    let Some(auths) = config.get("auths").and_then(|a| a.as_object()) else {
        return Ok(None);
    };
    let Some((key, entry)) = auths.iter().find(|(key, _)| host_of(key) == registry) else {
        return Ok(None);
    };
    let field = |name: &str| {
        entry
            .get(name)
            .and_then(|v| v.as_str())
            .filter(|v| !v.is_empty())
    };
    if let Some(token) = field("registrytoken") {
        return Ok(Some(RegistryAuth::Bearer(token.to_string())));
    }
    if let Some(encoded) = field("auth") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .with_context(|| {
                format!(
                    "{}: auths.{key:?}.auth is not base64 of user:password: run `docker login {registry}` again",
                    file.display()
                )
            })?;
        let (user, password) = decoded.split_once(':').with_context(|| {
            format!(
                "{}: auths.{key:?}.auth holds no ':' between user and password",
                file.display()
            )
        })?;
        return Ok(Some(RegistryAuth::Basic(
            user.to_string(),
            password.to_string(),
        )));
    }
    if let (Some(user), Some(password)) = (field("username"), field("password")) {
        return Ok(Some(RegistryAuth::Basic(
            user.to_string(),
            password.to_string(),
        )));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(auth: &RegistryAuth) -> (String, String) {
        match auth {
            RegistryAuth::Basic(u, p) => (u.clone(), p.clone()),
            other => panic!("expected basic auth, got {other:?}"),
        }
    }

    #[test]
    fn environment_then_docker_config_then_anonymous() {
        let dir = tempfile::tempdir().unwrap();
        let encoded = base64::engine::general_purpose::STANDARD.encode("alice:s3:cret");
        std::fs::write(
            dir.path().join("config.json"),
            format!(
                r#"{{"auths":{{"https://reg.example:5000/v1/":{{"auth":"{encoded}"}},"tok.example":{{"registrytoken":"T"}}}}}}"#
            ),
        )
        .unwrap();
        let none = |_: &str| None;
        let c = credentials_from("reg.example:5000", &none, Some(dir.path())).unwrap();
        assert_eq!(basic(&c.auth), ("alice".into(), "s3:cret".into()));
        assert!(c.source.contains("config.json"));
        let c = credentials_from("tok.example", &none, Some(dir.path())).unwrap();
        assert!(matches!(c.auth, RegistryAuth::Bearer(ref t) if t == "T"));
        let c = credentials_from("other:5000", &none, Some(dir.path())).unwrap();
        assert!(matches!(c.auth, RegistryAuth::Anonymous));

        let env = |name: &str| match name {
            USER_ENV => Some("bob".to_string()),
            PASSWORD_ENV => Some("pw".to_string()),
            _ => None,
        };
        let c = credentials_from("reg.example:5000", &env, Some(dir.path())).unwrap();
        assert_eq!(basic(&c.auth), ("bob".into(), "pw".into()));
        let half = |name: &str| (name == USER_ENV).then(|| "bob".to_string());
        assert!(credentials_from("reg.example:5000", &half, None).is_err());
    }

    #[test]
    fn a_damaged_auth_field_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"auths":{"reg:1":{"auth":"not base64!"}}}"#,
        )
        .unwrap();
        let err = credentials_from("reg:1", &|_| None, Some(dir.path())).unwrap_err();
        assert!(format!("{err:#}").contains("config.json"), "{err:#}");
    }
}
