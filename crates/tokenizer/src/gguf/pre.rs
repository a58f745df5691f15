//! Pre-tokenizer regexes for GGUF byte-level BPE vocabularies, by
//! `tokenizer.ggml.pre`.
//!
//! Mirrors `llm_tokenizer_bpe`'s constructor and `llama_vocab::impl::load` in
//! llama.cpp's `src/llama-vocab.cpp` (llama.cpp 0c1e5709, vendored by
//! llama-cpp-python 0.3.36). llama.cpp applies the regexes of a list one after
//! the other, each splitting the pieces the previous one left, and keeps the
//! text between matches as pieces of their own (`unicode_regex_split_stl`):
//! that is a sequence of Hugging Face `Split` pre-tokenizers with the
//! `Isolated` behaviour. Names whose llama.cpp splitter is hand-written C++
//! with no regex equivalent (kimi-k2, afmoe, tiny_aya, superbpe) are refused
//! rather than approximated. Non-ASCII characters in the regexes are written
//! as `\x{..}` escapes so that no editor or tool can normalise them.

/// How one `tokenizer.ggml.pre` value tokenizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PreSpec {
    /// The llama.cpp pre-tokenizer type, for [`crate::Tokenizer::kind`].
    pub family: &'static str,
    /// The regexes, applied in order.
    pub regexes: &'static [&'static str],
    /// Whole pre-tokenized words that are in the vocabulary are emitted
    /// as-is without running merges (`ignore_merges` in llama.cpp and HF).
    pub ignore_merges: bool,
    /// llama.cpp's default for `add_bos` when the GGUF has no
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: bool,
}

const GPT2: &[&str] = &[r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"];
const DEFAULT: &[&str] = &[
    r"[\p{P}\$\+<=>\^~\|]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
];
const LLAMA3: &[&str] = &[
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const JAIS2: &[&str] = &[
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",
];
const DEEPSEEK_LLM: &[&str] = &[
    r"[\r\n]",
    r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+",
    r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+",
    r"\s+$",
    r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
    r"\p{N}+",
];
const DEEPSEEK3: &[&str] = &[
    r"\p{N}{1,3}",
    r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];
const SPARK2_5: &[&str] = &[
    r"\p{N}{1,3}",
    r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##,
    r"\p{N}",
];
const YOUTU: &[&str] = &[
    r"[\x{AC00}-\x{D7A3}\x{3131}-\x{318E}]+|[\x{FF01}\x{2026}\x{201C}\x{201D}\x{2018}\x{2019}\x{2014}\x{FF1A}\x{FF1B}\x{FF0C}\x{3001}-\x{303F}\x{FE30}-\x{FE4F}]+|[\x{3105}-\x{312F}]+|[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const DEEPSEEK_CODER: &[&str] = &[
    r"[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
    r"\p{N}",
];
const FALCON: &[&str] = &[
    r"[\p{P}\$\+<=>\^~\|`]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"[0-9][0-9][0-9]",
];
const STARCODER: &[&str] = &[
    r"\p{N}",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
];
const QWEN2: &[&str] = &[
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const QWEN35: &[&str] = &[
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const PORO_WORDS: &str = r" ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+";
const PORO: &[&str] = &[PORO_WORDS];
const VIKING: &[&str] = &[PORO_WORDS, r"\p{N}"];
const TEKKEN: &[&str] = &[
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const CHAMELEON: &[&str] = &[
    r"<sentinel:[0-9]+>",
    r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    r"([\t\n]|    |  )",
    r"\p{N}",
    r"[\p{P}!-/:-@\[-`{-~]",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
];
const GPT4O: &[&str] = &[
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const GRANITE_EMB_MULTI: &[&str] = &[
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const BAILINGMOE: &[&str] = &[
    r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
];
const SEED_CODER: &[&str] = &[
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const UFAKZEKA: &[&str] =
    &[r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"];
const LAGUNA: &[&str] = &[
    r"[^\n]+|[\n]+",
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const EXAONE_MOE: &[&str] = &[
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
];
const MINICPM5: &[&str] = &[
    r"\p{N}{1,3}",
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

const fn spec(family: &'static str, regexes: &'static [&'static str]) -> PreSpec {
    PreSpec {
        family,
        regexes,
        ignore_merges: false,
        add_bos: false,
    }
}

/// The pre-tokenizer for a `tokenizer.ggml.pre` value (`None`: the key is
/// absent, which llama.cpp treats as "default"). `Err` says why a name is
/// refused.
pub(crate) fn pre_spec(pre: Option<&str>) -> Result<PreSpec, String> {
    let Some(pre) = pre else {
        return Ok(spec("default", DEFAULT));
    };
    let s = match pre {
        "default" => spec("default", DEFAULT),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => PreSpec {
            ignore_merges: true,
            add_bos: true,
            ..spec("llama3", LLAMA3)
        },
        "dbrx" | "smaug-bpe" => spec("llama3", LLAMA3),
        "jais-2" => spec("jais-2", JAIS2),
        "deepseek-llm" => spec("deepseek-llm", DEEPSEEK_LLM),
        "deepseek-coder" => spec("deepseek-coder", DEEPSEEK_CODER),
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => spec("deepseek-v3", DEEPSEEK3),
        "spark2_5" => spec("spark2_5", SPARK2_5),
        "youtu" => PreSpec {
            ignore_merges: true,
            ..spec("youtu", YOUTU)
        },
        "falcon" => spec("falcon", FALCON),
        "gpt-2" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" | "phi-2"
        | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0"
        | "mellum" | "modern-bert" | "exaone4" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => {
            spec("gpt-2", GPT2)
        }
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => spec("starcoder", STARCODER),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "stablelm2" | "megrez" | "hunyuan"
        | "solar-open" | "grok-2" => spec("qwen2", QWEN2),
        "qwen35" => spec("qwen35", QWEN35),
        "poro-chat" | "bloom" | "gpt3-finnish" => spec("poro", PORO),
        "chatglm-bpe" => spec("chatglm4", LLAMA3),
        "glm4" | "glm5" => PreSpec {
            ignore_merges: true,
            ..spec("chatglm4", LLAMA3)
        },
        "viking" => spec("viking", VIKING),
        "tekken" => PreSpec {
            ignore_merges: true,
            add_bos: true,
            ..spec("tekken", TEKKEN)
        },
        "chameleon" => PreSpec {
            add_bos: true,
            ..spec("chameleon", CHAMELEON)
        },
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => spec("gpt-4o", GPT4O),
        "granite-embed-multi-97m" => PreSpec {
            ignore_merges: true,
            ..spec("granite-embed-multi", GRANITE_EMB_MULTI)
        },
        "bailingmoe" | "bailingmoe2" | "llada-moe" => spec("bailingmoe", BAILINGMOE),
        "seed-coder" => spec("seed-coder", SEED_CODER),
        "ufakzeka" => spec("ufakzeka", UFAKZEKA),
        "laguna" => spec("laguna", LAGUNA),
        "exaone-moe" => spec("exaone-moe", EXAONE_MOE),
        "minicpm5" => PreSpec {
            ignore_merges: true,
            ..spec("minicpm5", MINICPM5)
        },
        "kimi-k2" | "afmoe" | "tiny_aya" | "cohere2moe" | "superbpe" => {
            return Err("llama.cpp splits this one with hand-written code, not a regex".into())
        }
        "gemma4" | "granite-embed-multi-311m" | "sarvam-moe" | "whitespace" => {
            return Err("SentencePiece-style BPE over raw UTF-8 is not implemented".into())
        }
        _ => return Err("unknown name (llama.cpp would refuse it too)".into()),
    };
    Ok(s)
}

/// The `tokenizer.ggml.pre` values of our conformance-tested vocabularies
/// all resolve, and every regex of every supported name compiles.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_regexes_compile() {
        for list in [
            GPT2,
            DEFAULT,
            LLAMA3,
            JAIS2,
            DEEPSEEK_LLM,
            DEEPSEEK3,
            SPARK2_5,
            YOUTU,
            DEEPSEEK_CODER,
            FALCON,
            STARCODER,
            QWEN2,
            QWEN35,
            PORO,
            VIKING,
            TEKKEN,
            CHAMELEON,
            GPT4O,
            GRANITE_EMB_MULTI,
            BAILINGMOE,
            SEED_CODER,
            UFAKZEKA,
            LAGUNA,
            EXAONE_MOE,
            MINICPM5,
        ] {
            for re in list {
                tokenizers::utils::SysRegex::new(re).unwrap_or_else(|e| panic!("{re}: {e}"));
            }
        }
    }

    #[test]
    fn names() {
        assert_eq!(pre_spec(None).unwrap().family, "default");
        assert!(pre_spec(Some("llama-bpe")).unwrap().ignore_merges);
        assert_eq!(pre_spec(Some("smollm")).unwrap().family, "starcoder");
        assert!(pre_spec(Some("kimi-k2")).is_err());
        assert!(pre_spec(Some("no-such-pre")).is_err());
    }
}
