//! TLS material for `rediss://` URLs: the certificates given to the builder (never
//! printed), checked, then handed to redis-rs and to direct connections.

#[cfg(feature = "tls")]
use super::builder::redact;
use super::*;

/// Certificates for a `rediss://` URL, in PEM; never printed.
#[cfg(feature = "tls")]
#[derive(Clone, Default)]
pub(super) struct TlsMaterial {
    root_cert: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

#[cfg(feature = "tls")]
impl TlsMaterial {
    /// Each PEM holds what it should: at least one certificate, and a private key.
    fn check(&self) -> std::result::Result<(), String> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = |what: &str, pem: &[u8]| {
            let n = CertificateDer::pem_slice_iter(pem)
                .map(|c| c.map_err(|e| format!("{what}: {e}")))
                .collect::<std::result::Result<Vec<_>, _>>()?
                .len();
            if n == 0 {
                return Err(format!("{what}: no PEM `CERTIFICATE` in it"));
            }
            Ok(())
        };
        if let Some(root) = &self.root_cert {
            certs("the TLS root certificate", root)?;
        }
        if let Some((cert, key)) = &self.client {
            certs("the TLS client certificate", cert)?;
            PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| format!("the TLS client key: no PEM private key in it ({e})"))?;
        }
        Ok(())
    }
}

#[cfg(feature = "tls")]
impl TlsMaterial {
    /// The rustls configuration of a direct connection.
    fn client_config(&self) -> std::result::Result<rustls::ClientConfig, String> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        // As redis-rs does: the system's roots are loaded (and must load) even when a CA
        // is given, which then replaces them; so both paths refuse the same settings.
        let native = rustls_native_certs::load_native_certs();
        if let Some(e) = native.errors.first() {
            return Err(format!("the system's root certificates: {e}"));
        }
        let mut roots = rustls::RootCertStore::empty();
        match &self.root_cert {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    roots
                        .add(cert.map_err(|e| e.to_string())?)
                        .map_err(|e| e.to_string())?;
                }
            }
            None => {
                for cert in native.certs {
                    roots.add(cert).map_err(|e| e.to_string())?;
                }
            }
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        match &self.client {
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| e.to_string())?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| e.to_string())
            }
            None => Ok(builder.with_no_client_auth()),
        }
    }
}

#[cfg(feature = "tls")]
impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |on: bool| if on { "<set>" } else { "<none>" };
        f.debug_struct("TlsMaterial")
            .field("root_cert", &set(self.root_cert.is_some()))
            .field("client_cert", &set(self.client.is_some()))
            .finish()
    }
}

impl LocksBuilder {
    /// The CA certificate (PEM) that a `rediss://` server's certificate must chain to,
    /// instead of the system's roots: for a private CA, or a managed Redis whose CA is not in the
    /// system store. Checked when the client is built (a file with no certificate in it is
    /// an error then, not at every connection). Needs the `tls` feature, which speaks TLS
    /// 1.2 and 1.3 through rustls with the `ring` provider, installed as the process's
    /// default unless one was installed before (install yours before building a client).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locks = lockcore::Locks::builder("rediss://redis.internal:6380/")
    ///     .tls_root_cert(std::fs::read("/etc/redis/ca.pem")?)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_cert = Some(pem.into());
        self
    }

    /// A client certificate and its private key (both PEM), for servers that
    /// authenticate clients by certificate (`tls-auth-clients yes`). Needs the `tls`
    /// feature.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locks = lockcore::Locks::builder("rediss://redis.internal:6380/")
    ///     .tls_root_cert(std::fs::read("/etc/redis/ca.pem")?)
    ///     .tls_client_cert(
    ///         std::fs::read("/etc/redis/client.pem")?,
    ///         std::fs::read("/etc/redis/client.key")?,
    ///     )
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Certificates from the environment, as the default client reads them (the
    /// attributes without `client = ...`, see [`crate::install`]): `REDIS_TLS_CA_FILE`
    /// (a PEM file, for [`tls_root_cert`](Self::tls_root_cert)), and `REDIS_TLS_CERT_FILE`
    /// with `REDIS_TLS_KEY_FILE` (for [`tls_client_cert`](Self::tls_client_cert)). Unset
    /// or empty variables change nothing; a file that cannot be read, or only one of the
    /// certificate and the key, is an [`Error::Backend`] of kind `Config`. Needs the `tls`
    /// feature.
    ///
    /// ```
    /// # fn main() -> Result<(), lockcore::Error> {
    /// let locks = lockcore::Locks::builder("rediss://127.0.0.1:6380/")
    ///     .tls_from_env()?
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_from_env(mut self) -> Result<Self> {
        let config_err = |detail: String| {
            Error::backend(
                &redact(&self.url),
                BackendError::new(BackendErrorKind::Config, detail),
            )
        };
        let read = |var: &str| -> Result<Option<Vec<u8>>> {
            match std::env::var_os(var) {
                Some(path) if !path.is_empty() => std::fs::read(&path).map(Some).map_err(|e| {
                    config_err(format!("cannot read {var} `{}`: {e}", path.display()))
                }),
                _ => Ok(None),
            }
        };
        let ca = read("REDIS_TLS_CA_FILE")?;
        let cert = read("REDIS_TLS_CERT_FILE")?;
        let key = read("REDIS_TLS_KEY_FILE")?;
        if let Some(ca) = ca {
            self.tls.root_cert = Some(ca);
        }
        match (cert, key) {
            (Some(cert), Some(key)) => self.tls.client = Some((cert, key)),
            (None, None) => {}
            _ => {
                return Err(config_err(
                    "REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE go together: set both or neither"
                        .into(),
                ));
            }
        }
        Ok(self)
    }

    /// The redis-rs client for the URL (and, with the `tls` feature, the certificates).
    pub(super) fn redis_client(&self, url: &str) -> std::result::Result<redis::Client, String> {
        let info = self.connection_info(url)?;
        #[cfg(feature = "tls")]
        if let Some(certs) = self.tls_certificates(std::slice::from_ref(&info))? {
            return redis::Client::build_with_tls(info, certs)
                .map_err(|e| format!("invalid TLS settings: {e}"));
        }
        redis::Client::open(info).map_err(|e| format!("invalid redis url: {e}"))
    }

    /// The certificates to give redis-rs for these URLs (`None`: its defaults), once
    /// checked; installs rustls's `ring` provider when a URL is `rediss://`, unless the
    /// process installed one before (install yours before building a client).
    #[cfg(feature = "tls")]
    pub(super) fn tls_certificates(
        &self,
        infos: &[redis::ConnectionInfo],
    ) -> std::result::Result<Option<redis::TlsCertificates>, String> {
        let tls = infos
            .iter()
            .any(|i| matches!(i.addr(), redis::ConnectionAddr::TcpTls { .. }));
        if tls {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        if self.tls.root_cert.is_none() && self.tls.client.is_none() {
            return Ok(None);
        }
        if !tls {
            return Err("TLS certificates are set but the URL is not `rediss://`".into());
        }
        self.tls.check()?;
        Ok(Some(redis::TlsCertificates {
            client_tls: self.tls.client.clone().map(|(client_cert, client_key)| {
                redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }
            }),
            root_cert: self.tls.root_cert.clone(),
        }))
    }

    /// How direct connections speak TLS: a rustls configuration like the one redis-rs
    /// makes for the URL (the given CA, else the system's roots; the client certificate
    /// if any). When it cannot be made, direct connections step aside (the multiplexed
    /// connection then reports what is wrong).
    pub(super) fn direct_tls(
        &self,
        info: &redis::ConnectionInfo,
    ) -> crate::backend::direct::DirectTls {
        #[cfg(feature = "tls")]
        if matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
            let config = match self.tls.client_config() {
                Ok(config) => Some(Arc::new(config)),
                Err(e) => {
                    tracing::warn!(target: "distlock", error = %e, "direct connections step aside over TLS: their configuration cannot be made");
                    None
                }
            };
            return crate::backend::direct::DirectTls { config };
        }
        let _ = info;
        crate::backend::direct::DirectTls::default()
    }
}
