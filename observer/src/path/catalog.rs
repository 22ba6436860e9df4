//! Documented default timeouts of common hops, each with its source.
//!
//! `None` in a field means "not applicable or not documented"; `Limit::Unlimited`
//! means the documented default is "no limit". Sources are the products'
//! own documentation as of 2024-2025.

use super::{
    Limit::{Seconds, Unlimited},
    Limits,
};

/// What a hop is, for the rules that apply to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// A client's connection pool: the outermost hop.
    ClientPool,
    /// A load balancer or NAT: keeps flows, holds no request itself.
    Network,
    /// A load balancer or proxy that holds requests.
    Proxy,
    /// An application server.
    Server,
    /// A database.
    Database,
}

impl Category {
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ClientPool => "client pool",
            Self::Network => "network",
            Self::Proxy => "proxy",
            Self::Server => "server",
            Self::Database => "database",
        }
    }
}

/// One catalog entry.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    pub id: &'static str,
    pub name: &'static str,
    pub category: Category,
    /// Its documented defaults.
    pub limits: Limits,
    /// Where the numbers come from.
    pub source: &'static str,
}

const fn k(id: &'static str, name: &'static str, category: Category, source: &'static str) -> Kind {
    Kind { id, name, category, limits: Limits::NONE, source }
}

/// The catalog.
pub const CATALOG: &[Kind] = &[
    // AWS ELB docs, "Connection idle timeout": default 60 s, applies to both
    // the client and target connections; target group health check timeout
    // default 5 s (HealthCheckTimeoutSeconds).
    Kind {
        limits: Limits {
            idle_timeout: Some(Seconds(60.0)),
            upstream_idle_timeout: Some(Seconds(60.0)),
            deadline: Some(Seconds(60.0)),
            health_check_timeout: Some(Seconds(5.0)),
            ..Limits::NONE
        },
        ..k(
            "aws-alb",
            "AWS Application Load Balancer",
            Category::Proxy,
            "AWS ELB user guide: idle timeout 60 s; health check timeout 5 s",
        )
    },
    // AWS NLB docs: TCP idle timeout 350 s (fixed until 2024, now settable).
    Kind {
        limits: Limits { idle_timeout: Some(Seconds(350.0)), ..Limits::NONE },
        ..k("aws-nlb", "AWS Network Load Balancer", Category::Network, "AWS NLB user guide: TCP idle timeout 350 s")
    },
    // AWS VPC docs, NAT gateways: "a connection that is idle for 350 seconds
    // or more times out".
    Kind {
        limits: Limits { idle_timeout: Some(Seconds(350.0)), ..Limits::NONE },
        ..k(
            "aws-nat-gateway",
            "AWS NAT Gateway",
            Category::Network,
            "AWS VPC user guide: NAT gateway idle timeout 350 s",
        )
    },
    // Azure Load Balancer docs: TCP idle timeout default 4 minutes.
    Kind {
        limits: Limits { idle_timeout: Some(Seconds(240.0)), ..Limits::NONE },
        ..k("azure-lb", "Azure Load Balancer", Category::Network, "Azure Load Balancer docs: TCP idle timeout 4 min")
    },
    // GCP Cloud NAT docs: TCP established connection idle timeout 1200 s.
    Kind {
        limits: Limits { idle_timeout: Some(Seconds(1200.0)), ..Limits::NONE },
        ..k("gcp-cloud-nat", "GCP Cloud NAT", Category::Network, "Cloud NAT docs: tcpEstablishedIdleTimeoutSec 1200 s")
    },
    // nginx docs: keepalive_timeout 75 s (client side), proxy_read_timeout
    // 60 s, upstream keepalive_timeout 60 s (ngx_http_upstream_module).
    Kind {
        limits: Limits {
            idle_timeout: Some(Seconds(75.0)),
            upstream_idle_timeout: Some(Seconds(60.0)),
            deadline: Some(Seconds(60.0)),
            ..Limits::NONE
        },
        ..k(
            "nginx",
            "nginx",
            Category::Proxy,
            "nginx docs: keepalive_timeout 75s, proxy_read_timeout 60s, upstream keepalive_timeout 60s",
        )
    },
    // HAProxy configuration manual: timeout client / server /
    // http-keep-alive have no default (HAProxy warns: infinite).
    Kind {
        limits: Limits {
            idle_timeout: Some(Unlimited),
            upstream_idle_timeout: Some(Unlimited),
            deadline: Some(Unlimited),
            ..Limits::NONE
        },
        ..k(
            "haproxy",
            "HAProxy",
            Category::Proxy,
            "HAProxy manual: timeout client/server/http-keep-alive unset by default (infinite)",
        )
    },
    // Node.js http docs: server.keepAliveTimeout 5000 ms, headersTimeout
    // 60000 ms, requestTimeout 300000 ms.
    Kind {
        limits: Limits {
            idle_timeout: Some(Seconds(5.0)),
            deadline: Some(Seconds(300.0)),
            headers_timeout: Some(Seconds(60.0)),
            ..Limits::NONE
        },
        ..k(
            "nodejs",
            "Node.js http server",
            Category::Server,
            "Node.js docs: keepAliveTimeout 5 s, headersTimeout 60 s, requestTimeout 300 s",
        )
    },
    // gunicorn settings docs: keepalive 2 s, timeout 30 s.
    Kind {
        limits: Limits { idle_timeout: Some(Seconds(2.0)), deadline: Some(Seconds(30.0)), ..Limits::NONE },
        ..k("gunicorn", "gunicorn", Category::Server, "gunicorn settings: keepalive 2 s, timeout 30 s")
    },
    // uvicorn settings docs: --timeout-keep-alive 5 s; no request timeout.
    Kind {
        limits: Limits { idle_timeout: Some(Seconds(5.0)), deadline: Some(Unlimited), ..Limits::NONE },
        ..k("uvicorn", "uvicorn", Category::Server, "uvicorn settings: timeout_keep_alive 5 s, no request timeout")
    },
    // PostgreSQL docs: statement_timeout 0 (disabled), idle_session_timeout 0.
    Kind {
        limits: Limits { idle_timeout: Some(Unlimited), deadline: Some(Unlimited), ..Limits::NONE },
        ..k(
            "postgresql",
            "PostgreSQL",
            Category::Database,
            "PostgreSQL docs: statement_timeout 0, idle_session_timeout 0 (disabled)",
        )
    },
    // Go net/http: DefaultTransport IdleConnTimeout 90 s; Client.Timeout 0.
    Kind {
        limits: Limits { idle_timeout: Some(Seconds(90.0)), ..Limits::NONE },
        ..k("go-http", "Go net/http client", Category::ClientPool, "Go net/http: DefaultTransport.IdleConnTimeout 90 s")
    },
    // OkHttp ConnectionPool: 5 idle connections kept 5 minutes.
    Kind {
        limits: Limits { idle_timeout: Some(Seconds(300.0)), ..Limits::NONE },
        ..k("okhttp", "OkHttp", Category::ClientPool, "OkHttp ConnectionPool: keepAliveDuration 5 min")
    },
    // reqwest ClientBuilder::pool_idle_timeout 90 s (hyper-util legacy client).
    Kind {
        limits: Limits { idle_timeout: Some(Seconds(90.0)), ..Limits::NONE },
        ..k("reqwest", "reqwest", Category::ClientPool, "reqwest ClientBuilder: pool_idle_timeout 90 s")
    },
    Kind {
        limits: Limits { idle_timeout: Some(Seconds(90.0)), ..Limits::NONE },
        ..k("hyper", "hyper-util client", Category::ClientPool, "hyper-util legacy Client: pool_idle_timeout 90 s")
    },
    // .NET SocketsHttpHandler.PooledConnectionIdleTimeout 1 minute.
    Kind {
        limits: Limits { idle_timeout: Some(Seconds(60.0)), ..Limits::NONE },
        ..k(
            "dotnet",
            ".NET HttpClient",
            Category::ClientPool,
            ".NET SocketsHttpHandler: PooledConnectionIdleTimeout 1 min",
        )
    },
    // JDK HttpClient: jdk.httpclient.keepalive.timeout 30 s (JDK 20+).
    Kind {
        limits: Limits { idle_timeout: Some(Seconds(30.0)), ..Limits::NONE },
        ..k(
            "jdk-httpclient",
            "JDK HttpClient",
            Category::ClientPool,
            "JDK net properties: jdk.httpclient.keepalive.timeout 30 s",
        )
    },
    // urllib3 PoolManager keeps idle connections with no timeout.
    Kind {
        limits: Limits { idle_timeout: Some(Unlimited), ..Limits::NONE },
        ..k("urllib3", "urllib3 / requests", Category::ClientPool, "urllib3: pooled connections have no idle timeout")
    },
    // HikariCP: idleTimeout 600000 ms, maxLifetime 1800000 ms.
    Kind {
        limits: Limits { idle_timeout: Some(Seconds(600.0)), max_lifetime: Some(Seconds(1800.0)), ..Limits::NONE },
        ..k("hikaricp", "HikariCP", Category::ClientPool, "HikariCP: idleTimeout 10 min, maxLifetime 30 min")
    },
];

/// Look a kind up by id.
#[must_use]
pub fn find(id: &str) -> Option<&'static Kind> {
    CATALOG.iter().find(|k| k.id == id)
}
