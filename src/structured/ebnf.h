#pragma once
// The EBNF dialect of guided_grammar / structured_outputs.grammar (GBNF-compatible; the full
// description is in docs/structured_outputs.md):
//
//   root   ::= "{" pair ("," pair)* "}"      # rules: name ::= expression; start rule `root`
//   pair   ::= string ":" value               # (else the first rule)
//   string ::= "\"" [^"\\]* "\""
//
// Expressions: "literal" or 'literal' (escapes \n \r \t \\ \" \' \xHH = a raw byte,
// \uHHHH / \UHHHHHHHH = a code point), [class] / [^class] of code points (or of raw bytes when it
// uses \x80-\xFF), `.` (any UTF-8 character), rule names, ( ... ), postfix * + ? {n} {n,} {n,m},
// sequence by juxtaposition, `|` alternation, `&` intersection of regular operands.
// Comments run from # to the end of the line. A rule ends where the next `name ::=` begins.
#include <string_view>

#include "structured/grammar.h"

namespace ossrt::structured {

// Throws StructuredError("position N", ...) (N = byte offset in the text) for invalid syntax,
// undefined rules, and the automaton's own refusals (left recursion, too large).
Grammar parse_ebnf(std::string_view text);

}  // namespace ossrt::structured
