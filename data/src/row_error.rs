//! [`RowError`]: why one row of a dataset file does not match its schema. The file and the
//! row's place are added by [`crate::DataError::Row`]; this says what is wrong inside it.

use oxalign_models::text::tokenizer::TokenizerError;

/// What is wrong with one row.
#[derive(Debug, thiserror::Error)]
pub enum RowError {
    /// A JSONL line over the reader's size limit.
    #[error("line of {bytes} bytes is longer than the {limit_mib} MiB limit")]
    TooLong {
        /// The line's length in bytes.
        bytes: u64,
        /// The limit in MiB.
        limit_mib: u64,
    },
    /// A JSONL line that is not JSON.
    #[error("not JSON: {0}")]
    NotJson(serde_json::Error),
    /// A Parquet row the row group does not hold.
    #[error("row group {group} has no row {row}")]
    NoSuchRow {
        /// Row group.
        group: usize,
        /// Row within it.
        row: u64,
    },
    /// The row is not a JSON object.
    #[error("the row is {0}, not an object")]
    NotObject(&'static str),
    /// A field of the wrong JSON type.
    #[error("`{key}` is {found}, not {expected}")]
    WrongType {
        /// The field.
        key: String,
        /// The JSON type found ("a number", "a list", ...).
        found: &'static str,
        /// What it should be.
        expected: &'static str,
    },
    /// A list field that is not a list of chat messages.
    #[error("`{key}`: not a list of {{\"role\", \"content\"}} messages: {source}")]
    NotMessages {
        /// The field.
        key: String,
        /// Why it does not deserialize.
        source: serde_json::Error,
    },
    /// A message list with no messages.
    #[error("`{key}` is an empty list: expected at least one {{\"role\", \"content\"}} message")]
    NoMessages {
        /// The field.
        key: String,
    },
    /// A required field is absent (the text names it, e.g. "`response`").
    #[error("no {0}")]
    Missing(&'static str),
    /// Both `prompt` and `messages` in a prompt row.
    #[error("give either `prompt` (a string) or `messages` (a list), not both")]
    PromptAndMessages,
    /// Message lists without a tokenizer to render them.
    #[error("message lists need a tokenizer with a chat template")]
    NoTokenizer,
    /// The chat template failed.
    #[error(transparent)]
    Template(#[from] TokenizerError),
    /// A conversation that should end with an assistant turn does not.
    #[error("the message list must end with an assistant turn")]
    NoFinalAssistantTurn,
    /// The rendered conversation does not start with its rendered prompt.
    #[error(
        "the chat template's rendering of the turns before an assistant turn (with the \
         generation prompt) is not a prefix of its rendering of the conversation, so the loss \
         cannot be put on that assistant turn alone"
    )]
    PromptNotPrefix,
    /// An SFT row with both `completion` and its alias `response`.
    #[error("give `completion` or its alias `response`, not both")]
    CompletionAndResponse,
    /// A language-modeling `text` row with a prompt or completion column too.
    #[error(
        "`text` (language modeling: the loss covers all of it) and `{other}` in one row: give \
         `text` alone, or `prompt` and `completion`"
    )]
    TextAndPrompt {
        /// The other column.
        other: &'static str,
    },
    /// A text prompt with message-list answers.
    #[error("a text `prompt` with message-list answers: give the prompt as messages too")]
    TextPromptChatAnswers,
    /// The two sides of a preference pair have different prompts.
    #[error("`chosen` and `rejected` do not share the same prompt turns")]
    PromptsDiffer,
}
