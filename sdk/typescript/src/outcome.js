// Outcome and tool-call constructors (shared by serve and the standard loop).
export const now = () => new Date().toISOString();
export const complete = (output, metadata) => (metadata ? { type: "complete", output, metadata } : { type: "complete", output });
export const fail = (code, message, retryable) => ({ type: "fail", error: retryable === undefined ? { code, message } : { code, message, retryable } });
export const escalate = (reason) => ({ type: "escalate", reason });
/** A ToolCall with `requestedAt` filled in. `traceId` must be the turn's. */
export const toolCall = ({ id, tool, arguments: args = {}, traceId }) => ({ id, tool, arguments: args, traceId, requestedAt: now() });

