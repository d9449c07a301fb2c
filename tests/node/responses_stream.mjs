// The official openai Node SDK streams a Responses call through kvgate: prints one JSON
// line with the event types, the streamed text, the completed response and the request id.
// Usage: KVGATE_BASE_URL=… KVGATE_API_KEY=… node responses_stream.mjs MODEL INSTRUCTIONS INPUT MAX
import OpenAI from "openai";

const [model, instructions, input, max] = process.argv.slice(2);
const client = new OpenAI({
  baseURL: process.env.KVGATE_BASE_URL,
  apiKey: process.env.KVGATE_API_KEY,
  maxRetries: 0,
});
const { data: stream, response } = await client.responses
  .create({ model, instructions, input, max_output_tokens: Number(max), stream: true })
  .withResponse();
const types = [];
let text = "";
let completed = null;
for await (const event of stream) {
  types.push(event.type);
  if (event.type === "response.output_text.delta") text += event.delta;
  if (event.type === "response.completed") completed = event.response;
}
console.log(
  JSON.stringify({ types, text, completed, requestId: response.headers.get("x-request-id") }),
);
