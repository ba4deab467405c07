//! Logs are data: one JSON object per line on stderr, `timestamp`, `level`, `message` and
//! the event's fields. A field whose text is a JSON object or array (a decision's `inputs`,
//! a list of arguments) stays nested, so `jq .inputs.peers` reads an incident without
//! `fromjson`.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The event formatter [`init`] installs.
pub struct JsonLines;

struct Fields(Map<String, Value>);

impl Fields {
    fn text(&mut self, field: &Field, text: String) {
        let nested = matches!(text.as_bytes().first(), Some(b'{' | b'['))
            .then(|| serde_json::from_str::<Value>(&text).ok())
            .flatten();
        let value = nested.unwrap_or(Value::String(text));
        self.0.insert(field.name().to_string(), value);
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.text(field, format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.text(field, value.to_string());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_string(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_string(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_string(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_string(), Value::from(value));
    }
}

/// The JSON object for one event (`timestamp` is left to the caller).
pub fn event_json(event: &Event<'_>) -> Map<String, Value> {
    let mut fields = Fields(Map::new());
    event.record(&mut fields);
    let mut line = Map::new();
    line.insert(
        "level".into(),
        Value::String(event.metadata().level().to_string()),
    );
    if let Some(message) = fields.0.remove("message") {
        let message = match message {
            Value::String(s) => Value::String(s),
            other => Value::String(other.to_string()),
        };
        line.insert("message".into(), message);
    }
    line.extend(fields.0);
    line
}

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = Map::new();
        line.insert(
            "timestamp".into(),
            Value::String(
                humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string(),
            ),
        );
        line.extend(event_json(event));
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// Installs JSON-lines logging on stderr, filtered by `ETCD_STEWARD_LOG` (default `info`).
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ETCD_STEWARD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .event_format(JsonLines)
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    /// Captures the JSON of every event.
    struct Capture(Arc<Mutex<Vec<Map<String, Value>>>>);

    impl<S: Subscriber> tracing_subscriber::Layer<S> for Capture {
        fn on_event(&self, event: &Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            if let Ok(mut all) = self.0.lock() {
                all.push(event_json(event));
            }
        }
    }

    #[test]
    fn json_fields_stay_nested_and_sentences_stay_strings() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(Capture(seen.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let inputs = serde_json::json!({"peers": [{"name": "etcd-1"}]});
            let argv = vec!["--name=etcd-0".to_string()];
            tracing::info!(round = 3u64, reason = "{not json: a sentence", inputs = %inputs, args = ?argv, "decision");
        });
        let all = seen.lock().map(|v| v.clone()).unwrap_or_default();
        let line = &all[0];
        assert_eq!(line["message"], "decision");
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["round"], 3);
        assert_eq!(line["inputs"]["peers"][0]["name"], "etcd-1");
        assert_eq!(line["args"][0], "--name=etcd-0");
        assert_eq!(line["reason"], "{not json: a sentence");
    }
}
