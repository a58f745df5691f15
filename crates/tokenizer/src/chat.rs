//! Chat templates: a conversation → the prompt text, as Hugging Face
//! transformers' `apply_chat_template` renders it.
//!
//! transformers compiles templates in a Jinja2 `ImmutableSandboxedEnvironment`
//! with `trim_blocks=True`, `lstrip_blocks=True` and the `loopcontrols`
//! extension, and adds `raise_exception(msg)`, `strftime_now(fmt)` and its own
//! `tojson` (Python's `json.dumps`, no HTML escaping). The render context is
//! `messages`, `add_generation_prompt`, `tools` (`None` when absent) and the
//! special tokens (`bos_token`, `eos_token`). We mirror that with minijinja,
//! plus minijinja-contrib's Python string/dict methods (`strip`, `split`,
//! `startswith`, `items`, ...). transformers' `{% generation %}` block (used
//! to build assistant masks) renders its body, so it becomes a no-op block.

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::{Tokenizer, TokenizerError};

mod json;
mod pyrepr;
mod time;

/// One message of a conversation. `role` and `content` are what every
/// template reads; the OpenAI extras are passed through when set, and so is
/// any other field in `extra` (e.g. `reasoning_content`), since templates see
/// each message as a JSON object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The text.
    pub content: String,
    /// The author's name (OpenAI `name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The assistant's tool calls (OpenAI `tool_calls`), as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// For `tool` messages: the call answered (OpenAI `tool_call_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Any other field, passed to the template as is.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl ChatMessage {
    /// A message with just a role and a text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..ChatMessage::default()
        }
    }
}

/// A compiled chat template. `Send + Sync`: compile once per model, render
/// from any thread.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template text (tool-call formats are read from it).
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

const NAME: &str = "chat_template";

/// The error `raise_exception` attaches as source, so that [`render`]
/// can report the template's own message verbatim.
///
/// [`render`]: ChatTemplate::render
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

impl ChatTemplate {
    /// Compiles `source`. `bos_token`/`eos_token` are the texts templates
    /// see as `bos_token`/`eos_token` (undefined when `None`, like a
    /// tokenizer without them in transformers).
    pub fn new(
        source: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<ChatTemplate, TokenizerError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message.clone())
                    .with_source(Raised(message)))
            },
        );
        env.add_filter("tojson", json::tojson);
        // Jinja2 prints dicts and lists (and `|string`s them) as Python
        // reprs, and `none is iterable` is false there.
        env.set_formatter(|out, state, value| {
            if matches!(value.kind(), ValueKind::Map | ValueKind::Seq) && !value.is_safe() {
                out.write_str(&pyrepr::repr(value)).map_err(Error::from)
            } else {
                minijinja::escape_formatter(out, state, value)
            }
        });
        env.add_filter("string", |value: Value| match value.kind() {
            ValueKind::Map | ValueKind::Seq => Value::from(pyrepr::repr(&value)),
            ValueKind::String => value,
            _ => Value::from(value.to_string()),
        });
        env.add_test("iterable", |value: Value| {
            !value.is_none() && !value.is_undefined() && value.try_iter().is_ok()
        });
        env.add_function("strftime_now", |fmt: &str| {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            time::strftime(fmt, now)
        });
        env.add_template_owned(NAME, without_generation_blocks(source))
            .map_err(|e| TokenizerError::TemplateSyntax {
                message: error_message(&e),
            })?;
        Ok(ChatTemplate {
            env,
            source: source.to_owned(),
            bos_token: bos_token.map(str::to_owned),
            eos_token: eos_token.map(str::to_owned),
        })
    }

    /// The tokenizer's default template with its BOS/EOS texts; `Ok(None)`
    /// when the model ships no template.
    pub fn for_tokenizer(tokenizer: &Tokenizer) -> Result<Option<ChatTemplate>, TokenizerError> {
        let Some(source) = tokenizer.chat_template() else {
            return Ok(None);
        };
        let special = tokenizer.special_tokens();
        let bos = special.bos.as_ref().map(|t| t.text.as_str());
        let eos = special.eos.as_ref().map(|t| t.text.as_str());
        ChatTemplate::new(source, bos, eos).map(Some)
    }

    /// The template's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Makes `strftime_now` report this instant (seconds since the Unix
    /// epoch, UTC) instead of the clock: for reproducible prompts and tests.
    pub fn with_fixed_time(mut self, unix_seconds: i64) -> ChatTemplate {
        self.env.add_function("strftime_now", move |fmt: &str| {
            time::strftime(fmt, unix_seconds)
        });
        self
    }

    /// Renders a conversation. `tools` is the OpenAI `tools` array (the
    /// template sees `none` when absent).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String, TokenizerError> {
        self.render_with_kwargs(
            messages,
            add_generation_prompt,
            tools,
            &serde_json::Map::new(),
        )
    }

    /// [`render`](Self::render) with extra template variables, like
    /// transformers' `apply_chat_template(..., **kwargs)` (e.g.
    /// `enable_thinking` for Qwen3, `date_string` for Llama 3.1). They
    /// cannot replace `messages`, `tools` or `add_generation_prompt`.
    pub fn render_with_kwargs(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TokenizerError> {
        let mut ctx: Vec<(String, Value)> = Vec::with_capacity(kwargs.len() + 5);
        if let Some(bos) = &self.bos_token {
            ctx.push(("bos_token".into(), Value::from(bos.as_str())));
        }
        if let Some(eos) = &self.eos_token {
            ctx.push(("eos_token".into(), Value::from(eos.as_str())));
        }
        for (k, v) in kwargs {
            ctx.push((k.clone(), Value::from_serialize(v)));
        }
        ctx.push(("messages".into(), Value::from_serialize(messages)));
        ctx.push((
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        ));
        ctx.push((
            "tools".into(),
            tools.map_or(Value::from(()), Value::from_serialize),
        ));
        let ctx: Value = ctx.into_iter().collect();
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| TokenizerError::TemplateRender {
                message: error_message(&e),
            })?;
        // minijinja can panic on input it should refuse (2.24 indexes an
        // empty list for `messages[::-1]` over no messages): a hostile
        // conversation must be an error, never a dead tokenizer worker.
        let rendered =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| template.render(ctx)))
                .map_err(|panic| {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    TokenizerError::TemplateRender {
                        message: format!(
                            "the template engine failed on this conversation ({what})"
                        ),
                    }
                })?;
        rendered.map_err(|e| {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(s) = source {
                if let Some(Raised(message)) = s.downcast_ref::<Raised>() {
                    return TokenizerError::TemplateException {
                        message: message.clone(),
                    };
                }
                source = s.source();
            }
            TokenizerError::TemplateRender {
                message: error_message(&e),
            }
        })
    }
}

/// minijinja's message with the template line, on one line.
fn error_message(e: &Error) -> String {
    match e.line() {
        Some(line) => match e.detail() {
            Some(detail) => format!("{}: {detail} (line {line})", e.kind()),
            None => format!("{} (line {line})", e.kind()),
        },
        None => e.to_string(),
    }
}

/// Rewrites transformers' `{% generation %}` / `{% endgeneration %}` into an
/// always-true `if` block, keeping any `-` whitespace control.
fn without_generation_blocks(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            break;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.trim_end().strip_suffix(['-', '+']) {
            Some(b) => (b, &body.trim_end()[b.len()..]),
            None => (body, ""),
        };
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{lead} {r} {trail}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, msgs: &[ChatMessage]) -> Result<String, TokenizerError> {
        ChatTemplate::new(src, Some("<s>"), Some("</s>"))?.render(msgs, true, None)
    }

    #[test]
    fn trims_blocks_like_hf() {
        let src = "{{ bos_token }}\n{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content | trim }}]\n  {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}>{% endif %}";
        let out = render(src, &[ChatMessage::new("user", " hi ")]).unwrap();
        assert_eq!(out, "<s>\n[hi]\n>");
    }

    #[test]
    fn raise_exception_reports_the_message() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}";
        let err = render(src, &[ChatMessage::new("assistant", "x")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Conversation roles must alternate user/assistant/user/assistant/..."
        );
        assert!(matches!(err, TokenizerError::TemplateException { .. }));
    }

    #[test]
    fn python_methods_loop_controls_and_namespace() {
        let src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.content.startswith('skip') %}{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}{{ m.content.strip().split(',') | join('|') }};{% if loop.index == 3 %}{% break %}{% endif %}{% endfor %}{{ ns.n }}";
        let msgs = [
            ChatMessage::new("user", " a,b "),
            ChatMessage::new("user", "skip me"),
            ChatMessage::new("user", "c"),
            ChatMessage::new("user", "d"),
        ];
        assert_eq!(render(src, &msgs).unwrap(), "a|b;c;2");
    }

    #[test]
    fn extras_pass_through_and_tools_default_to_none() {
        let mut m = ChatMessage::new("tool", "42");
        m.tool_call_id = Some("call_1".into());
        m.extra.insert("reasoning_content".into(), "think".into());
        let src = "{{ messages[0].tool_call_id }} {{ messages[0].reasoning_content }} {{ messages[0].name is defined }} {{ tools is none }}";
        assert_eq!(render(src, &[m]).unwrap(), "call_1 think False True");
    }

    #[test]
    fn generation_blocks_render_their_body() {
        let src = "{%- for m in messages %}{% generation %}[{{ m.content }}]{%- endgeneration %}{% endfor %}";
        assert_eq!(
            render(src, &[ChatMessage::new("assistant", "x")]).unwrap(),
            "[x]"
        );
        assert_eq!(
            without_generation_blocks("a{%- generation -%}b"),
            "a{%- if true -%}b"
        );
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let err = ChatTemplate::new("ok\n{% if %}", None, None).unwrap_err();
        assert!(matches!(err, TokenizerError::TemplateSyntax { .. }));
        assert!(err.to_string().contains("line 2"), "{err}");
    }

    #[test]
    fn strftime_now_uses_the_fixed_time() {
        let t = ChatTemplate::new("{{ strftime_now('%d %b %Y') }}", None, None)
            .unwrap()
            .with_fixed_time(1_721_952_000); // 2024-07-26
        assert_eq!(t.render(&[], false, None).unwrap(), "26 Jul 2024");
    }
}
