//! Control requests: `POST /peer/recovery` (`recover --yes`), `POST /peer/restore`
//! (`restore --snapshot NAME --yes`) and `POST /peer/rebuild` (the leader's sidecar, for a
//! member whose data diverged), the requests that make a sidecar stop its etcd. They
//! are served on the peer-facing port only, and a request is held only when it passes,
//! in this order:
//! 1. authentication ([`crate::control`], [`authenticate`]: from the head, before any of the
//!    body is read): 401 without the token, 403 when control requests are off (neither peer
//!    TLS nor a token);
//! 2. its shape: 413 too large (more than [`MAX_CONTROL_BYTES`], refused as it arrives), 400
//!    not a request;
//! 3. its expiry: 422 when already past; a later one is clamped to [`REQUEST_TTL`] from
//!    receipt;
//! 4. one request at a time: the same ID again is 202 and changes nothing; another ID while
//!    one is held is 409;
//! 5. this pod's own check ([`CheckRequests`]), before anything is stopped: a restore's
//!    snapshot listed, verified and usable from here; a recovery whose survivor is this pod
//!    must be the plan this pod makes; a rebuild's proof must stand against the member list
//!    now and this member's own `HashKV` must still differ from the majority's. 422
//!    otherwise.
//!
//! Every refusal is counted in `etcd_steward_control_requests_refused_total{reason}`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::AppState;
use crate::clock::unix_now;
use crate::control::REQUEST_TTL;
use crate::control::{ControlAuth, Gate, TOKEN_OPTION};
use crate::facts::rebuild::RebuildRequest;
use crate::facts::{RecoveryRequest, RestoreRequest};
use crate::sidecar::recovery::{Expiring, Inbox, Taken};

/// This pod's check of a request before it is held (and before anything is stopped for
/// it): `Err` says why the request is not valid here.
pub trait CheckRequests: Send + Sync {
    fn recovery<'a>(&'a self, request: &'a RecoveryRequest) -> BoxFuture<'a, Result<(), String>>;
    fn restore<'a>(&'a self, request: &'a RestoreRequest) -> BoxFuture<'a, Result<(), String>>;
    fn rebuild<'a>(&'a self, request: &'a RebuildRequest) -> BoxFuture<'a, Result<(), String>>;
}

/// Refuses every request: for a surface that cannot check them.
pub struct CannotCheck;

impl CheckRequests for CannotCheck {
    fn recovery<'a>(&'a self, _: &'a RecoveryRequest) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Err("this sidecar cannot check recovery requests".into()) })
    }
    fn restore<'a>(&'a self, _: &'a RestoreRequest) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Err("this sidecar cannot check restore requests".into()) })
    }
    fn rebuild<'a>(&'a self, _: &'a RebuildRequest) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Err("this sidecar cannot check rebuild requests".into()) })
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// Why a control request was refused, as the metric's `reason` label says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No token, or a wrong one.
    Unauthenticated,
    /// Control requests are off (neither peer TLS nor a token).
    Disabled,
    /// Not a request, too large, or not valid from this pod's view.
    Invalid,
    /// Its expiry has passed.
    Expired,
    /// Another request is held.
    Conflict,
}

impl Refused {
    fn label(self) -> &'static str {
        match self {
            Refused::Unauthenticated => "unauthenticated",
            Refused::Disabled => "disabled",
            Refused::Invalid => "invalid",
            Refused::Expired => "expired",
            Refused::Conflict => "conflict",
        }
    }
}

/// How control requests are admitted and checked here, and the refusals counted.
#[derive(Clone)]
pub struct Control {
    pub auth: ControlAuth,
    pub checks: Arc<dyn CheckRequests>,
    refused: Family<ReasonLabel, Counter>,
    /// One check at a time: a flood of requests costs one store listing or observation
    /// after another, never many at once.
    checking: Arc<tokio::sync::Mutex<()>>,
}

impl Control {
    /// Registers `etcd_steward_control_requests_refused_total` in `registry`.
    pub fn register(
        registry: &mut Registry,
        auth: ControlAuth,
        checks: Arc<dyn CheckRequests>,
    ) -> Self {
        let c = Control::unregistered(auth, checks);
        registry.register(
            "etcd_steward_control_requests_refused",
            "Control requests (recovery, restore) this sidecar refused, by reason: unauthenticated, disabled, invalid, expired, conflict",
            c.refused.clone(),
        );
        c
    }

    /// Refusals are counted but not exported (a surface without `/metrics`).
    pub fn unregistered(auth: ControlAuth, checks: Arc<dyn CheckRequests>) -> Self {
        let refused: Family<ReasonLabel, Counter> = Family::default();
        for r in [
            Refused::Unauthenticated,
            Refused::Disabled,
            Refused::Invalid,
            Refused::Expired,
            Refused::Conflict,
        ] {
            let _ = refused.get_or_create(&ReasonLabel { reason: r.label() });
        }
        Control {
            auth,
            checks,
            refused,
            checking: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// How many requests were refused for `reason`.
    pub fn refused(&self, reason: Refused) -> u64 {
        self.refused
            .get_or_create(&ReasonLabel {
                reason: reason.label(),
            })
            .get()
    }

    fn refuse(&self, reason: Refused, code: StatusCode, text: String) -> Response {
        self.refused
            .get_or_create(&ReasonLabel {
                reason: reason.label(),
            })
            .inc();
        tracing::warn!(reason = reason.label(), status = code.as_u16(), refusal = %text, "control request refused");
        (
            code,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("{text}\n"),
        )
            .into_response()
    }
}

/// `POST /peer/recovery`: an operator's `recover --yes` hands this pod the request. Once
/// held it is shown in the report, and the survivor's sidecar stops its etcd once.
pub async fn accept_recovery(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let check = |r: RecoveryRequest| {
        let s = s.clone();
        async move { s.control.checks.recovery(&r).await }
    };
    accept(&s, &s.recovery, &headers, &body, check).await
}

/// `POST /peer/restore`: an operator's `restore --snapshot NAME --yes` hands this pod the
/// request; once held, this pod's sidecar stops its etcd once so that `init` sets the
/// data aside.
pub async fn accept_restore(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let check = |r: RestoreRequest| {
        let s = s.clone();
        async move { s.control.checks.restore(&r).await }
    };
    accept(&s, &s.restore, &headers, &body, check).await
}

/// `POST /peer/rebuild`: the leader's sidecar hands this pod the proof that its member's
/// data diverged from the majority's; once held (the proof stands and this member's own
/// hash still differs), this pod's sidecar stops its etcd so that `init` sets the data
/// aside and the member joins again as a new one.
pub async fn accept_rebuild(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let check = |r: RebuildRequest| {
        let s = s.clone();
        async move { s.control.checks.rebuild(&r).await }
    };
    accept(&s, &s.rebuild, &headers, &body, check).await
}

/// The largest control request body read (a rebuild's proof, every voter's hash, is the
/// largest); a longer one is refused (413) as it arrives, not after it was buffered.
pub const MAX_CONTROL_BYTES: usize = crate::report::MAX_REPORT_BYTES;

/// Step 1, as a layer on the control routes: the token (or, with peer TLS, the handshake
/// already made) is checked from the request's head, before any of its body is read, so
/// that a client without it costs a refusal and never a buffered body.
pub async fn authenticate(
    State(s): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let c = &s.control;
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    match c.auth.admit(authorization) {
        Gate::Open => next.run(request).await,
        Gate::Unauthenticated => c.refuse(
            Refused::Unauthenticated,
            StatusCode::UNAUTHORIZED,
            "control requests need Authorization: Bearer <the token in --control-token-file>".into(),
        ),
        Gate::Off => c.refuse(
            Refused::Disabled,
            StatusCode::FORBIDDEN,
            format!("control requests are off: give the sidecar and the commands {TOKEN_OPTION} (the same file), or peer TLS (--peer-cert-file, --peer-key-file, --peer-trusted-ca-file)"),
        ),
    }
}

/// Steps 2 to 5, once [`authenticate`] let the request through.
async fn accept<T, F, Fut>(
    s: &AppState,
    inbox: &Inbox<T>,
    _headers: &HeaderMap,
    body: &[u8],
    check: F,
) -> Response
where
    T: Expiring + serde::de::DeserializeOwned,
    F: FnOnce(T) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let c = &s.control;
    if body.len() > MAX_CONTROL_BYTES {
        return c.refuse(
            Refused::Invalid,
            StatusCode::PAYLOAD_TOO_LARGE,
            "request too large".into(),
        );
    }
    let mut request = match serde_json::from_slice::<T>(body) {
        Ok(r) => r,
        Err(e) => {
            return c.refuse(
                Refused::Invalid,
                StatusCode::BAD_REQUEST,
                format!("not a valid request: {e}"),
            )
        }
    };
    let now = unix_now();
    if request.expires_unix() <= now {
        return c.refuse(
            Refused::Expired,
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "request {} expired at {} (now {now})",
                request.id(),
                request.expires_unix()
            ),
        );
    }
    // Held at most REQUEST_TTL from receipt, whatever the sender asked.
    let cap = now + REQUEST_TTL.as_secs();
    if request.expires_unix() > cap {
        request.set_expires_unix(cap);
    }
    let _one_at_a_time = c.checking.lock().await;
    if let Some(held) = [
        s.recovery.held_id(),
        s.restore.held_id(),
        s.rebuild.held_id(),
    ]
    .into_iter()
    .flatten()
    .find(|h| h != request.id())
    {
        return conflict(c, &held, request.id());
    }
    if inbox.held_id().as_deref() == Some(request.id()) {
        return (StatusCode::ACCEPTED, "already held\n").into_response();
    }
    let id = request.id().to_string();
    if let Err(why) = check(request.clone()).await {
        return c.refuse(
            Refused::Invalid,
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("request {id} is not valid from this pod: {why}; nothing was stopped"),
        );
    }
    match inbox.take(request) {
        Taken::Held => (StatusCode::ACCEPTED, "held\n").into_response(),
        Taken::AlreadyHeld => (StatusCode::ACCEPTED, "already held\n").into_response(),
        Taken::Conflict(held) => conflict(c, &held, &id),
    }
}

fn conflict(c: &Control, held: &str, id: &str) -> Response {
    c.refuse(
        Refused::Conflict,
        StatusCode::CONFLICT,
        format!("request {held} is held until it completes or expires: {id} is refused"),
    )
}
