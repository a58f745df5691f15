//! JSON parsing with field paths in errors.

use serde::de::DeserializeOwned;

use crate::ProtocolError;

/// Parses `value` as `T`; a type error names the field (`param`) it is in.
pub fn parse_json<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, ProtocolError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." || path.is_empty() {
            ProtocolError {
                message: format!("invalid request: {inner}"),
                param: None,
                code: None,
            }
        } else {
            ProtocolError::field(&path, format!("invalid value for '{path}': {inner}"))
        }
    })
}

/// Parses a request body: bytes → JSON object.
pub fn body_json(bytes: &[u8]) -> Result<serde_json::Value, ProtocolError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| ProtocolError {
        message: format!("malformed JSON body: {e}"),
        param: None,
        code: None,
    })?;
    if !value.is_object() {
        return Err(ProtocolError {
            message: "the request body must be a JSON object".into(),
            param: None,
            code: None,
        });
    }
    Ok(value)
}
