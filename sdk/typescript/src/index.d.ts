// The SDK's surface (hand written). Protocol shapes come from
// protocol.d.ts, generated from the JSON Schema.
import type {
  ErrorKind, RuntimeEvent, RuntimeLimits, RuntimeManifest, RuntimeTurnOutcome,
  RuntimeTurnRequest, ToolCall, ToolResult,
} from "./protocol.js";

export type * from "./protocol.js";

export declare const PROTOCOL_VERSION: 1;
export declare const PLUGIN_ENV: "SHAREDOS_PLUGIN";
export declare const SDK_NAME: string;
export declare const NOT_A_TERMINAL_PROGRAM: string;

/** A host call refused by the host, or by the SDK checking first. */
export declare class HostCallError extends Error {
  readonly kind: ErrorKind;
  readonly data: Record<string, unknown>;
}

/** A one-way flag: the drain and the abort. */
export declare class Signal {
  readonly raised: boolean;
  isRaised(): boolean;
  onRaise(cb: () => void): void;
  wait(): Promise<void>;
}

/** What a plugin is handed: exactly five members. */
export interface RuntimeHost {
  readonly limits: RuntimeLimits;
  /** Resolves to the ToolResult, refusals (`denied`) included. */
  invokeTool(call: ToolCall, step?: number): Promise<ToolResult>;
  emit(event: RuntimeEvent): void;
  annotate(key: string, value: unknown): void;
  readonly draining: Signal;
}

export interface RuntimePlugin {
  manifest(): RuntimeManifest;
  run(request: RuntimeTurnRequest, host: RuntimeHost, abort: Signal): Promise<RuntimeTurnOutcome>;
  /** Accept several turns of one session in one process (`turns: "many"`, docs/PROTOCOL.md 4.6). */
  manyTurns?: boolean | (() => boolean);
}

export declare function serve(plugin: RuntimePlugin): Promise<number>;
export declare function startedByHost(): boolean;
export declare function now(): string;
export declare function complete(output: unknown, metadata?: Record<string, unknown>): RuntimeTurnOutcome;
export declare function fail(code: string, message: string, retryable?: boolean): RuntimeTurnOutcome;
export declare function escalate(reason: string): RuntimeTurnOutcome;
export declare function toolCall(call: { id: string; tool: string; arguments?: Record<string, unknown>; traceId: string }): ToolCall;

export type AgentTurnInput = { type: "start" } | { type: "tool_result"; result: ToolResult };
export type AgentTurnDecision =
  | { type: "tool_call"; call: ToolCall; step?: number }
  | RuntimeTurnOutcome;
export interface AgentTurnSession {
  next(input: AgentTurnInput, signal: Signal): Promise<AgentTurnDecision> | AgentTurnDecision;
  close?(outcome: "succeeded" | "failed" | "escalated" | "cancelled"): Promise<void> | void;
}
export interface AgentTurnDriver {
  manifest?(): RuntimeManifest;
  open(request: RuntimeTurnRequest, signal: Signal): Promise<AgentTurnSession> | AgentTurnSession;
}
export declare function createStandardRuntime(driver: AgentTurnDriver, options?: { closeTimeoutMs?: number }): RuntimePlugin;
export declare function standardRuntimeManifest(): RuntimeManifest;
