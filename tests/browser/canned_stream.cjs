// A chat completion stream as k3 serve sends it, whose reasoning, answer and tool arguments
// hold markup that would run if the page parsed it as HTML (the browser test serves it in
// place of the server's).
"use strict";

function chunk(delta, extra = {}) {
  return `data: ${JSON.stringify({
    id: "chatcmpl-canned", object: "chat.completion.chunk", created: 0, model: "demo",
    choices: [{ index: 0, delta, finish_reason: null, logprobs: null }], ...extra,
  })}\n\n`;
}

function cannedStream() {
  const answer = [
    "<script>window.pwned = 1</script>\n\n",
    '<img src=x onerror="window.pwned = 2">\n\n',
    "[a link](javascript:window.pwned=3) and **bold**\n\n",
    "```js\nlet x = 1 < 2;\n```\n",
  ];
  return [
    chunk({ role: "assistant", content: "" }),
    chunk({ reasoning_content: '<img src=x onerror="window.pwned = 4">' }),
    ...answer.map((text) => chunk({ content: text })),
    chunk({
      tool_calls: [{
        index: 0, id: "call_0", type: "function",
        function: { name: "<b>shell</b>", arguments: '{"html": "<img src=x onerror=alert(1)>"}' },
      }],
    }),
    `data: ${JSON.stringify({
      id: "chatcmpl-canned", object: "chat.completion.chunk", created: 0, model: "demo",
      choices: [],
      usage: { prompt_tokens: 12, completion_tokens: 30, total_tokens: 42,
        prompt_tokens_details: { cached_tokens: 0 } },
    })}\n\n`,
    "data: [DONE]\n\n",
  ].join("");
}

module.exports = { cannedStream };
