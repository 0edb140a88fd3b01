'use strict';
/**
 * Automatic checkpoints around tool calls, the Node twin of the Python tool interceptor:
 *
 * - a write tool (any tool that does not declare `readOnly: true`) gets a checkpoint with
 *   trigger before_tool_execute just before it runs and after_tool_execute after it succeeded;
 * - a read-only tool never gets one; a failed tool gets no after-checkpoint and its error is
 *   passed on untouched;
 * - which triggers fire is read from core.checkpoints.auto_create_on over the config RPC (per
 *   plan, on every call: a plan's override wins), minus the triggers switched off locally;
 * - each checkpoint call gets core.checkpoints.client_deadline_ms (the config read before the
 *   before-checkpoint counts against it);
 * - both checkpoints of a call carry a `tool_call_id` label and the description
 *   "<trigger> <tool name>", and a tool name longer than the server's 256 characters is clipped
 *   in source_tool, as the Python interceptor does;
 * - no client or no plan_id: the tool just runs;
 * - checkpointd down, too slow or out of space (RESOURCE_EXHAUSTED with reason STORAGE_EXHAUSTED):
 *   core.checkpoints.on_unavailable decides, "proceed" (run the tool, log a warning) or "refuse"
 *   (do not run it) - only the before-checkpoint can refuse, the after-checkpoint is still tried
 *   when the before one was lost. A before-checkpoint refused for another reason stops the tool
 *   even under "proceed". A write that already happened is never undone, so a missing
 *   after-checkpoint, whatever the reason, is always only a warning.
 *
 * Unknown trigger names, from the caller or the server, are refused with a RangeError.
 */

const { randomUUID } = require('node:crypto');
const grpc = require('@grpc/grpc-js');
const { AUTO_TRIGGERS } = require('./contract');
const { CheckpointUnavailableError, CheckpointdError } = require('./errors');

const AUTO_CREATE_ON_KEY = 'core.checkpoints.auto_create_on';
const ON_UNAVAILABLE_KEY = 'core.checkpoints.on_unavailable';
const CLIENT_DEADLINE_KEY = 'core.checkpoints.client_deadline_ms';
/** The server's limits on source_tool and description (characters), as in the Python client. */
const MAX_SOURCE_TOOL = 256;
const MAX_DESCRIPTION = 4096;
const ON_UNAVAILABLE_MODES = Object.freeze(['proceed', 'refuse']);
/** The automatic triggers that belong to a tool call, in the order they fire. */
const TOOL_TRIGGERS = Object.freeze(['before_tool_execute', 'after_tool_execute']);
/** How many plans' last-known policies are kept for when checkpointd cannot be reached. */
const REMEMBERED_PLANS = 1024;
/** The registry defaults, used until the server has been reached once. */
const DEFAULT_POLICY = Object.freeze({
  enabled: Object.freeze([...AUTO_TRIGGERS]),
  onUnavailable: 'proceed',
  deadlineMs: 5000,
});

/** The text clipped to `limit` characters (code points), its last one an ellipsis when clipped. */
function clip(text, limit) {
  const chars = Array.from(text);
  return chars.length <= limit ? text : `${chars.slice(0, limit - 1).join('')}\u2026`;
}

/** Validates trigger names against the closed list of automatic triggers. */
function checkTriggers(names, origin) {
  if (!Array.isArray(names)) throw new TypeError(`${origin} must be a list of trigger names`);
  for (const name of names) {
    if (!AUTO_TRIGGERS.includes(name)) {
      throw new RangeError(`${origin}: unknown trigger ${JSON.stringify(name)}; known: ${AUTO_TRIGGERS.join(', ')}`);
    }
  }
  return names;
}

/** Reads the trigger switches for a plan from ConfigService, remembering the last answer. */
class TriggerPolicy {
  /**
   * @param {import('./client').CheckpointdClient} client
   * @param {{disabledTriggers?: string[]}} [options] Triggers this component switches off locally.
   */
  constructor(client, { disabledTriggers = [] } = {}) {
    this.client = client;
    this.disabled = new Set(checkTriggers(disabledTriggers, 'disabledTriggers'));
    this.lastKnown = new Map();
  }

  /**
   * The policy in force for a plan: {enabled: Set<string>, onUnavailable}. When checkpointd
   * cannot be reached the last answer for the plan (else the defaults) is returned with
   * `unreachable` set to the error.
   */
  async forPlan(planId) {
    let policy;
    try {
      // Bounded like a checkpoint call: by the plan's last known client_deadline_ms.
      const deadlineMs = this.lastKnown.get(planId)?.deadlineMs ?? this.client.deadlineMs ?? DEFAULT_POLICY.deadlineMs;
      const entries = await this.client.listConfig({ planId, deadlineMs });
      policy = this.fromEntries(entries);
      this.remember(planId, policy);
    } catch (error) {
      if (!(error instanceof CheckpointdError) || !error.unreachable) throw error;
      policy = { ...(this.lastKnown.get(planId) ?? DEFAULT_POLICY), unreachable: error };
    }
    return { ...policy, enabled: new Set(policy.enabled.filter((t) => !this.disabled.has(t))) };
  }

  /** Keeps the newest answers only, so a long-lived runtime does not grow with every plan it saw. */
  remember(planId, policy) {
    this.lastKnown.delete(planId);
    this.lastKnown.set(planId, policy);
    if (this.lastKnown.size > REMEMBERED_PLANS) this.lastKnown.delete(this.lastKnown.keys().next().value);
  }

  fromEntries(entries) {
    const byKey = new Map(entries.map((e) => [e.key, e.value]));
    for (const key of [AUTO_CREATE_ON_KEY, ON_UNAVAILABLE_KEY]) {
      if (!byKey.has(key)) throw new Error(`checkpointd does not register the config key ${key}`);
    }
    const onUnavailable = byKey.get(ON_UNAVAILABLE_KEY);
    if (!ON_UNAVAILABLE_MODES.includes(onUnavailable)) {
      throw new RangeError(`${ON_UNAVAILABLE_KEY}: unknown mode ${JSON.stringify(onUnavailable)}`);
    }
    let deadlineMs = DEFAULT_POLICY.deadlineMs;
    if (byKey.has(CLIENT_DEADLINE_KEY)) {
      deadlineMs = byKey.get(CLIENT_DEADLINE_KEY);
      if (!Number.isInteger(deadlineMs) || deadlineMs <= 0) {
        throw new RangeError(`${CLIENT_DEADLINE_KEY}: expected a positive integer, got ${JSON.stringify(deadlineMs)}`);
      }
    }
    return { enabled: [...checkTriggers(byKey.get(AUTO_CREATE_ON_KEY), AUTO_CREATE_ON_KEY)], onUnavailable, deadlineMs };
  }
}

/**
 * Wraps one tool call in before/after checkpoints. Framework-neutral: give it the call's facts
 * and a function that runs the tool.
 */
class ToolCheckpointInterceptor {
  /**
   * @param {object} options
   * @param {import('./client').CheckpointdClient|null} options.client Null: checkpoints are off.
   * @param {string[]} [options.disabledTriggers] E.g. ["before_tool_execute"].
   * @param {{warn: Function}} [options.logger] Receives the "proceeding without a checkpoint" warnings.
   */
  constructor({ client, disabledTriggers = [], logger = console } = {}) {
    this.client = client ?? null;
    this.policy = this.client ? new TriggerPolicy(this.client, { disabledTriggers }) : null;
    if (!this.client) checkTriggers(disabledTriggers, 'disabledTriggers');
    this.logger = logger;
  }

  /**
   * @template T
   * @param {{toolName: string, readOnly?: boolean, planId?: string, workspaceRoot?: string}} call
   * @param {() => Promise<T>|T} invoke Runs the tool.
   * @returns {Promise<T>}
   */
  async around(call, invoke) {
    if (!this.client || !call.planId || call.readOnly === true) return invoke();
    const started = Date.now();
    const policy = await this.policy.forPlan(call.planId);
    const wanted = TOOL_TRIGGERS.filter((t) => policy.enabled.has(t));
    if (wanted.length === 0) return invoke();
    if (policy.unreachable) {
      // The config read already found checkpointd down: no checkpoint is tried for this call.
      if (policy.enabled.has('before_tool_execute')) this.refuseIfRequired(policy, call, policy.unreachable);
      this.logger.warn(`checkpointd unreachable; running ${call.toolName} without checkpoints: ${policy.unreachable.message}`);
      return invoke();
    }
    const toolCallId = randomUUID().replace(/-/g, '');
    if (policy.enabled.has('before_tool_execute')) {
      try {
        const remainingMs = policy.deadlineMs - (Date.now() - started);
        if (remainingMs <= 0) {
          throw new CheckpointdError({
            code: grpc.status.DEADLINE_EXCEEDED,
            details: `checkpointd's settings could not be read within the ${policy.deadlineMs} ms deadline`,
            reason: null,
            domain: null,
            metadata: {},
            method: 'CreateCheckpoint',
          });
        }
        await this.checkpoint(call, 'before_tool_execute', toolCallId, remainingMs);
      } catch (error) {
        if (!(error instanceof CheckpointdError) || !error.unreachable) throw error;
        this.refuseIfRequired(policy, call, error);
        this.logger.warn(
          `checkpointd could not record the before_tool_execute checkpoint; running ${call.toolName} without it: ${error.message}`,
        );
      }
    }
    const result = await invoke();
    if (policy.enabled.has('after_tool_execute')) {
      try {
        await this.checkpoint(call, 'after_tool_execute', toolCallId, policy.deadlineMs);
      } catch (error) {
        // The write happened: whatever the reason, the result stands and this is only a warning.
        this.logger.warn(`${call.toolName} ran without an after_tool_execute checkpoint: ${error?.message ?? error}`);
      }
    }
    return result;
  }

  checkpoint(call, trigger, toolCallId, deadlineMs) {
    return this.client.createCheckpoint(call.planId, {
      trigger,
      sourceTool: clip(call.toolName, MAX_SOURCE_TOOL),
      labels: { tool_call_id: toolCallId },
      description: clip(`${trigger} ${call.toolName}`, MAX_DESCRIPTION),
      workspaceRoot: call.workspaceRoot ?? '',
      deadlineMs,
    });
  }

  /** Under "refuse", a lost before-checkpoint stops the write tool. */
  refuseIfRequired(policy, call, error) {
    if (policy.onUnavailable !== 'refuse') return;
    throw new CheckpointUnavailableError(
      `refusing to run ${call.toolName}: no before_tool_execute checkpoint could be taken (${ON_UNAVAILABLE_KEY}=refuse)`,
      { cause: error, toolName: call.toolName, trigger: 'before_tool_execute' },
    );
  }
}

/**
 * A minimal tool runner built on the interceptor: the shape an agent framework would copy.
 * A tool is {readOnly?: boolean, run(args, context)}; context is {planId, workspaceRoot}.
 */
class ToolRunner {
  /** @param {ConstructorParameters<typeof ToolCheckpointInterceptor>[0]} [options] */
  constructor(options = {}) {
    this.interceptor = new ToolCheckpointInterceptor(options);
    this.tools = new Map();
  }

  register(name, tool) {
    if (typeof tool?.run !== 'function') throw new TypeError(`tool ${name} needs a run(args, context) function`);
    if (this.tools.has(name)) throw new Error(`tool ${name} is already registered`);
    this.tools.set(name, { readOnly: tool.readOnly === true, run: tool.run });
    return this;
  }

  /**
   * @param {string} name
   * @param {object} args
   * @param {{planId?: string, workspaceRoot?: string}} [context]
   */
  async execute(name, args, context = {}) {
    const tool = this.tools.get(name);
    if (!tool) throw new RangeError(`unknown tool ${JSON.stringify(name)}; registered: ${[...this.tools.keys()].join(', ')}`);
    const call = { toolName: name, readOnly: tool.readOnly, planId: context.planId, workspaceRoot: context.workspaceRoot };
    return this.interceptor.around(call, () => tool.run(args, context));
  }
}

module.exports = {
  AUTO_CREATE_ON_KEY,
  CLIENT_DEADLINE_KEY,
  ON_UNAVAILABLE_KEY,
  ToolCheckpointInterceptor,
  ToolRunner,
  TriggerPolicy,
};
