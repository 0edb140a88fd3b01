'use strict';
/**
 * CheckpointdClient: CheckpointService and ConfigService over one channel, with a deadline on
 * every call, a request_id on every call that takes one (so a retry never duplicates), retries
 * only for UNAVAILABLE, and errors as CheckpointdError carrying the ErrorInfo reason.
 *
 * Results use the project's short enum names ("before_tool_execute", "modified") and Dates for
 * timestamps; see the typedefs below. Field names are the proto names in lowerCamelCase.
 */

const { randomUUID } = require('node:crypto');
const { Readable } = require('node:stream');
const grpc = require('@grpc/grpc-js');
const { loadContract } = require('./contract');
const { fromServiceError } = require('./errors');
const { fromValue, timestampToDate, toValue } = require('./values');

/** The server's own default for core.checkpoints.client_deadline_ms. */
const DEFAULT_DEADLINE_MS = 5000;
/**
 * A watch is a long call but still bounded: when it ends with DEADLINE_EXCEEDED the caller
 * re-subscribes, so a connection that died silently is noticed within this time.
 */
const DEFAULT_WATCH_DEADLINE_MS = 10 * 60 * 1000;

/**
 * Largest response accepted: the server's send limit (its responses carry up to 16 MiB of state,
 * pages of records and change lists), where gRPC's default of 4 MiB would make some acknowledged
 * checkpoints unreadable.
 */
const MAX_RESPONSE_BYTES = 64 * 1024 * 1024;

/** Retry UNAVAILABLE only: every retried mutation carries a request_id or is idempotent by nature. */
const SERVICE_CONFIG = JSON.stringify({
  methodConfig: [
    {
      name: [{ service: 'checkpoint.v1.CheckpointService' }, { service: 'checkpoint.v1.ConfigService' }],
      retryPolicy: {
        maxAttempts: 3,
        initialBackoff: '0.1s',
        maxBackoff: '1s',
        backoffMultiplier: 2,
        retryableStatusCodes: ['UNAVAILABLE'],
      },
    },
  ],
});

/**
 * @typedef {object} SkippedFile
 * @property {string} path Workspace-relative, '/'-separated; undecodable bytes of a name that is
 *   not UTF-8 show as \xNN escapes.
 * @property {Buffer} rawPath The exact bytes of such a name; empty for a UTF-8 one.
 * @property {number} sizeBytes
 * @property {string} reason E.g. "FILE_TOO_LARGE".
 */

/**
 * @typedef {object} Checkpoint
 * @property {string} checkpointId ULID.
 * @property {string} planId ULID.
 * @property {number} sequence 1, 2, 3 ... per plan.
 * @property {string|null} phase Short Phase name, e.g. "before_tool_execute".
 * @property {string|null} trigger Short Trigger name, e.g. "manual".
 * @property {string} sourceTool
 * @property {Record<string,string>} labels
 * @property {string} description
 * @property {Date|null} createTime
 * @property {string} workspaceRoot
 * @property {boolean} hasFiles
 * @property {number} fileCount
 * @property {number} totalSizeBytes
 * @property {number} stateSizeBytes
 * @property {SkippedFile[]} skippedFiles At most 1,000 (and 64 KiB of paths).
 * @property {number} skippedFilesOmitted How many more were skipped than skippedFiles lists.
 * @property {string} treeDigest "sha256:<hex>".
 * @property {string} rollbackTargetCheckpointId
 * @property {Buffer} state Empty unless view "full" or from a rollback.
 */

/**
 * @typedef {object} FileChange
 * @property {string} path Undecodable bytes of a name that is not UTF-8 show as \xNN escapes.
 * @property {Buffer} rawPath The exact bytes of such a name; empty for a UTF-8 one.
 * @property {string} kind "added" | "modified" | "deleted" | "type_changed".
 * @property {string|null} baseType "file" | "symlink" | "directory", null when absent.
 * @property {string|null} targetType
 * @property {number} baseSizeBytes
 * @property {number} targetSizeBytes
 * @property {number} baseMode Permission bits, e.g. 0o644.
 * @property {number} targetMode
 * @property {string|null} textDiffStatus With textDiffs: "text" | "binary" | "too_large" | "not_a_file"
 *   | "unreadable"; null otherwise.
 * @property {string} textDiff With status "text": the unified diff.
 */

/**
 * @typedef {object} Plan
 * @property {string} planId
 * @property {string} workspaceRoot Empty for a plan with state only.
 * @property {Date|null} createTime When the server first saw the plan.
 * @property {Date|null} updateTime When its newest checkpoint was recorded.
 * @property {number} checkpointCount
 * @property {string} newestCheckpointId
 * @property {number} totalSizeBytes What its checkpoints hold, before deduplication.
 */

/**
 * @typedef {object} CheckpointFile One entry of a checkpoint's tree.
 * @property {string} path Workspace-relative; undecodable bytes of a name that is not UTF-8 show as
 *   \xNN escapes.
 * @property {Buffer} rawPath The exact bytes of such a name; empty for a UTF-8 one.
 * @property {string|null} entryType "file" | "symlink" | "directory".
 * @property {number} sizeBytes A file's content, a symlink's target text; 0 for a directory.
 * @property {number} mode Permission bits, e.g. 0o644.
 * @property {string} symlinkTarget A symlink's target text (never followed).
 * @property {Buffer} rawSymlinkTarget Its exact bytes when they are not UTF-8.
 */

/**
 * @typedef {object} PendingWrite A write a task made after a checkpoint (a LangGraph pending write).
 * @property {string} taskId
 * @property {number} index Negative for a special write (error, interrupt ...), replaced by a later put.
 * @property {string} channel
 * @property {string} valueType How value is encoded, e.g. "msgpack".
 * @property {Buffer} value
 * @property {string} taskPath Orders the writes.
 */

/**
 * @typedef {object} ConfigEntry
 * @property {string} key
 * @property {*} value The effective value as plain JavaScript.
 * @property {string|null} source "default" | "global" | "plan".
 * @property {*} defaultValue
 * @property {string} description
 * @property {string} planId
 * @property {Date|null} updateTime
 */

/**
 * @typedef {object} CallOptions
 * @property {number} [deadlineMs] Overrides the client's deadline for this call.
 */

class CheckpointdClient {
  /**
   * @param {string} target "HOST:PORT" or "unix:///abs/path.sock".
   * @param {object} [options]
   * @param {number} [options.deadlineMs] Deadline of every unary call (default 5000).
   * @param {number} [options.watchDeadlineMs] Deadline of a WatchConfig stream (default 10 min;
   *   Infinity for none).
   * @param {string} [options.bearerToken] Sent as `authorization: Bearer ...` on every call.
   * @param {grpc.ChannelCredentials} [options.credentials] Default: insecure (local sidecar).
   * @param {object} [options.channelOptions] Extra grpc-js channel options.
   */
  constructor(target, options = {}) {
    const {
      deadlineMs = DEFAULT_DEADLINE_MS,
      watchDeadlineMs = DEFAULT_WATCH_DEADLINE_MS,
      bearerToken = null,
      credentials = grpc.credentials.createInsecure(),
      channelOptions = {},
    } = options;
    this.deadlineMs = checkDeadline(deadlineMs);
    this.watchDeadlineMs = checkDeadline(watchDeadlineMs);
    this.bearerToken = bearerToken;
    this.target = target;
    const contract = loadContract();
    this.vocabulary = contract.vocabulary;
    const allOptions = {
      'grpc.service_config': SERVICE_CONFIG,
      'grpc.enable_retries': 1,
      'grpc.max_receive_message_length': MAX_RESPONSE_BYTES,
      ...channelOptions,
    };
    this.checkpoints = new contract.CheckpointService(target, credentials, allOptions);
    this.config = new contract.ConfigService(target, credentials, {
      ...allOptions,
      channelOverride: this.checkpoints.getChannel(),
    });
  }

  /** Closes the channel; calls in flight are cancelled. */
  close() {
    this.checkpoints.close();
  }

  /**
   * Records a checkpoint of the plan's workspace files and state.
   * @param {string} planId ULID.
   * @param {object} [options]
   * @param {string} [options.workspaceRoot] Absolute path on the server's host.
   * @param {string} [options.trigger] Short Trigger name; "manual" when omitted.
   * @param {string} [options.phase] Short Phase name; derived from the trigger when omitted.
   * @param {string} [options.sourceTool]
   * @param {Record<string,string>} [options.labels]
   * @param {string} [options.description]
   * @param {Uint8Array} [options.state] Opaque plan state.
   * @param {string} [options.requestId] Idempotency key; a fresh UUID when omitted.
   * @param {number} [options.deadlineMs]
   * @returns {Promise<Checkpoint>}
   */
  async createCheckpoint(planId, options = {}) {
    const request = {
      planId,
      workspaceRoot: options.workspaceRoot ?? '',
      trigger: options.trigger === undefined ? 'TRIGGER_UNSPECIFIED' : this.vocabulary.toWire('Trigger', options.trigger),
      phase: options.phase === undefined ? 'PHASE_UNSPECIFIED' : this.vocabulary.toWire('Phase', options.phase),
      sourceTool: options.sourceTool ?? '',
      labels: options.labels ?? {},
      description: options.description ?? '',
      state: options.state ? Buffer.from(options.state) : Buffer.alloc(0),
      requestId: options.requestId ?? randomUUID(),
    };
    const response = await this.unary(this.checkpoints, 'CreateCheckpoint', request, options);
    return this.toCheckpoint(response.checkpoint);
  }

  /**
   * @param {string} checkpointId
   * @param {object} [options]
   * @param {"basic"|"full"} [options.view] "full" includes the state bytes.
   * @param {number} [options.deadlineMs]
   * @returns {Promise<Checkpoint>}
   */
  async getCheckpoint(checkpointId, options = {}) {
    const view = options.view === undefined ? 'CHECKPOINT_VIEW_UNSPECIFIED' : this.vocabulary.toWire('CheckpointView', options.view);
    const response = await this.unary(this.checkpoints, 'GetCheckpoint', { checkpointId, view }, options);
    return this.toCheckpoint(response.checkpoint);
  }

  /**
   * One page of a plan's checkpoints, newest first.
   * @param {string} planId
   * @param {object} [options]
   * @param {number} [options.pageSize] 50 when omitted, at most 1000.
   * @param {string} [options.pageToken]
   * @param {string} [options.filter] AIP-160, e.g. `phase = "on_error"`.
   * @param {number} [options.deadlineMs]
   * @returns {Promise<{checkpoints: Checkpoint[], nextPageToken: string}>}
   */
  async listCheckpoints(planId, options = {}) {
    const request = {
      planId,
      pageSize: options.pageSize ?? 0,
      pageToken: options.pageToken ?? '',
      filter: options.filter ?? '',
    };
    const response = await this.unary(this.checkpoints, 'ListCheckpoints', request, options);
    return {
      checkpoints: response.checkpoints.map((c) => this.toCheckpoint(c)),
      nextPageToken: response.nextPageToken,
    };
  }

  /**
   * Every checkpoint of a plan, newest first, fetching pages as needed.
   * @param {string} planId
   * @param {{pageSize?: number, filter?: string, deadlineMs?: number}} [options]
   * @returns {AsyncGenerator<Checkpoint>}
   */
  async *iterateCheckpoints(planId, options = {}) {
    let pageToken = '';
    do {
      const page = await this.listCheckpoints(planId, { ...options, pageToken });
      yield* page.checkpoints;
      pageToken = page.nextPageToken;
    } while (pageToken);
  }

  /**
   * @param {string} checkpointId
   * @param {CallOptions} [options]
   */
  async deleteCheckpoint(checkpointId, options = {}) {
    await this.unary(this.checkpoints, 'DeleteCheckpoint', { checkpointId }, options);
  }

  /**
   * Records writes that follow a checkpoint (a LangGraph saver's pending writes): a repeated
   * (taskId, index) keeps its first value when index >= 0 and takes the new one when negative.
   * @param {string} checkpointId
   * @param {PendingWrite[]} writes
   * @param {CallOptions} [options]
   */
  async putPendingWrites(checkpointId, writes, options = {}) {
    await this.unary(this.checkpoints, 'PutPendingWrites', { checkpointId, writes }, options);
  }

  /**
   * A checkpoint's pending writes, ordered by taskPath, taskId, then index.
   * @param {string} checkpointId
   * @param {CallOptions} [options]
   * @returns {Promise<PendingWrite[]>}
   */
  async listPendingWrites(checkpointId, options = {}) {
    return (await this.unary(this.checkpoints, 'ListPendingWrites', { checkpointId }, options)).writes;
  }

  /**
   * Deletes every checkpoint an AIP-160 filter selects, in one plan or (no planId) in every plan;
   * resolves to those deleted, without state.
   * @param {{planId?: string, filter?: string, deadlineMs?: number}} [options]
   * @returns {Promise<Checkpoint[]>}
   */
  async deleteCheckpoints(options = {}) {
    const { planId = '', filter = '' } = options;
    const response = await this.unary(this.checkpoints, 'DeleteCheckpoints', { planId, filter }, options);
    const deleted = response.checkpoints;
    deleted.omitted = Number(response.checkpointsOmitted ?? 0); // listed up to 32 MiB, the rest counted
    return deleted;
  }

  /**
   * The paths that differ from a base checkpoint to a target checkpoint (or the live workspace).
   * @param {string} baseCheckpointId
   * @param {object} [options]
   * @param {string} [options.targetCheckpointId] Omitted: the plan's live workspace.
   * @param {string[]} [options.paths] Only these workspace-relative paths (and what is under them).
   * @param {Uint8Array[]} [options.rawPaths] More such paths as bytes, for names that are not UTF-8
   *   (a FileChange's rawPath).
   * @param {boolean} [options.textDiffs] Also return each changed text file's unified diff
   *   (`textDiff`, with `textDiffStatus` "text", "binary", "too_large", "not_a_file" or "unreadable").
   * @param {boolean} [options.allPages] Every page (the default; each a call with `deadlineMs`), or
   *   with false only the first.
   * @param {number} [options.pageSize] At most this many changes a page; 0 (the default): as many as
   *   fit in 16 MiB.
   * @param {number} [options.deadlineMs]
   * @returns {Promise<FileChange[] & {omitted: number}>} The changes listed, and as `omitted` how many
   *   more paths differ (0 after every page). Against the live workspace each page is a new look at it.
   */
  async diffCheckpoints(baseCheckpointId, options = {}) {
    const changes = [];
    let pageToken = '';
    for (;;) {
      const request = {
        baseCheckpointId,
        targetCheckpointId: options.targetCheckpointId ?? '',
        paths: options.paths ?? [],
        rawPaths: (options.rawPaths ?? []).map((p) => Buffer.from(p)),
        textDiffs: options.textDiffs ?? false,
        pageSize: options.pageSize ?? 0,
        pageToken,
      };
      const response = await this.unary(this.checkpoints, 'DiffCheckpoints', request, options);
      changes.push(...response.changes.map((c) => this.toFileChange(c)));
      changes.omitted = Number(response.changesOmitted ?? 0);
      pageToken = response.nextPageToken ?? '';
      if (!pageToken || options.allPages === false) return changes;
    }
  }

  /**
   * Restores a plan's files and/or state to a checkpoint; the server records a safety
   * checkpoint first, so the rollback itself can be undone.
   * @param {string} planId
   * @param {string} checkpointId
   * @param {object} [options]
   * @param {"files"|"state"|"files_and_state"} [options.scope] Both when omitted.
   * @param {string[]} [options.paths] Restore only these workspace-relative paths.
   * @param {Uint8Array[]} [options.rawPaths] More such paths as bytes (see diffCheckpoints).
   * @param {boolean} [options.dryRun]
   * @param {boolean} [options.allowNestedWorkspaces] Let the changes reach into another plan's
   *   workspace; refused (NESTED_WORKSPACE) otherwise.
   * @param {Uint8Array} [options.currentState]
   * @param {string} [options.requestId] Idempotency key; a fresh UUID when omitted.
   * @param {number} [options.deadlineMs]
   * @returns {Promise<{changes: FileChange[], state: Buffer, safetyCheckpoint: Checkpoint|null, dryRun: boolean}>}
   */
  async rollback(planId, checkpointId, options = {}) {
    const request = {
      planId,
      checkpointId,
      scope: options.scope === undefined ? 'ROLLBACK_SCOPE_UNSPECIFIED' : this.vocabulary.toWire('RollbackScope', options.scope),
      paths: options.paths ?? [],
      rawPaths: (options.rawPaths ?? []).map((p) => Buffer.from(p)),
      dryRun: options.dryRun ?? false,
      allowNestedWorkspaces: options.allowNestedWorkspaces ?? false,
      currentState: options.currentState ? Buffer.from(options.currentState) : Buffer.alloc(0),
      requestId: options.requestId ?? randomUUID(),
    };
    const response = await this.unary(this.checkpoints, 'Rollback', request, options);
    return {
      changes: response.changes.map((c) => this.toFileChange(c)),
      changesOmitted: Number(response.changesOmitted ?? 0),
      state: response.state,
      safetyCheckpoint: response.safetyCheckpoint ? this.toCheckpoint(response.safetyCheckpoint) : null,
      dryRun: response.dryRun,
      nestedWorkspaces: response.nestedWorkspaces,
    };
  }

  /**
   * One page of the plans the server knows, newest plan id first.
   * @param {object} [options]
   * @param {number} [options.pageSize] 50 when omitted, at most 1000.
   * @param {string} [options.pageToken]
   * @param {string} [options.filter] AIP-160: `workspace_root = "/dir"`, `workspace_root : "/dir"`
   *   (at or under), `update_time > "2026-01-31T00:00:00Z"` (also <, <=, >=), `labels.KEY = "VALUE"`
   *   (one of the plan's checkpoints has that label), joined by AND.
   * @param {number} [options.deadlineMs]
   * @returns {Promise<{plans: Plan[], nextPageToken: string}>}
   */
  async listPlans(options = {}) {
    const request = { pageSize: options.pageSize ?? 0, pageToken: options.pageToken ?? '', filter: options.filter ?? '' };
    const response = await this.unary(this.checkpoints, 'ListPlans', request, options);
    return { plans: response.plans.map((p) => this.toPlan(p)), nextPageToken: response.nextPageToken };
  }

  /**
   * Every plan matching the filter, fetching pages as needed.
   * @param {{pageSize?: number, filter?: string, deadlineMs?: number}} [options]
   * @returns {AsyncGenerator<Plan>}
   */
  async *iteratePlans(options = {}) {
    let pageToken = '';
    do {
      const page = await this.listPlans({ ...options, pageToken });
      yield* page.plans;
      pageToken = page.nextPageToken;
    } while (pageToken);
  }

  /**
   * One plan: its workspace, checkpoint count, newest checkpoint and total size.
   * @param {string} planId
   * @param {CallOptions} [options]
   * @returns {Promise<Plan>}
   */
  async getPlan(planId, options = {}) {
    const response = await this.unary(this.checkpoints, 'GetPlan', { planId }, options);
    return this.toPlan(response.plan);
  }

  /**
   * A file's content as it was in a checkpoint (a symlink's: its target text), in one Buffer.
   * @param {string} checkpointId
   * @param {string} filePath Workspace-relative.
   * @param {CallOptions} [options]
   * @returns {Promise<Buffer>}
   */
  readFile(checkpointId, filePath, options = {}) {
    const deadline = Date.now() + checkDeadline(options.deadlineMs ?? Math.max(this.deadlineMs, 600_000));
    const call = this.checkpoints.ReadCheckpointFile({ checkpointId, path: filePath }, this.metadata(), { deadline });
    return new Promise((resolve, reject) => {
      const chunks = [];
      call.on('data', (response) => chunks.push(response.data));
      call.on('error', (error) => reject(fromServiceError(error, 'ReadCheckpointFile')));
      call.on('end', () => resolve(Buffer.concat(chunks)));
    });
  }

  /**
   * One page of a directory's entries as it was in a checkpoint (the workspace root when no path),
   * a directory before what it holds, names sorted.
   * @param {string} checkpointId
   * @param {object} [options]
   * @param {string} [options.path] Workspace-relative directory; the root when omitted.
   * @param {Uint8Array} [options.rawPath] The directory as bytes, for a name that is not UTF-8.
   * @param {boolean} [options.recursive] The whole subtree, not only the directory's own entries.
   * @param {number} [options.pageSize] 50 when omitted, at most 1000.
   * @param {string} [options.pageToken]
   * @param {number} [options.deadlineMs]
   * @returns {Promise<{files: CheckpointFile[], nextPageToken: string}>}
   */
  async listFiles(checkpointId, options = {}) {
    const request = {
      checkpointId,
      path: options.path ?? '',
      rawPath: options.rawPath ? Buffer.from(options.rawPath) : Buffer.alloc(0),
      recursive: options.recursive ?? false,
      pageSize: options.pageSize ?? 0,
      pageToken: options.pageToken ?? '',
    };
    const response = await this.unary(this.checkpoints, 'ListCheckpointFiles', request, options);
    return {
      files: response.files.map((f) => ({ ...f, entryType: this.vocabulary.fromWire('EntryType', f.entryType) })),
      nextPageToken: response.nextPageToken,
    };
  }

  /**
   * Every entry listFiles would return, fetching pages as needed.
   * @param {string} checkpointId
   * @param {{path?: string, rawPath?: Uint8Array, recursive?: boolean, pageSize?: number, deadlineMs?: number}} [options]
   * @returns {AsyncGenerator<CheckpointFile>}
   */
  async *iterateFiles(checkpointId, options = {}) {
    let pageToken = '';
    do {
      const page = await this.listFiles(checkpointId, { ...options, pageToken });
      yield* page.files;
      pageToken = page.nextPageToken;
    } while (pageToken);
  }

  /**
   * A checkpoint's whole tree as an uncompressed POSIX (pax) tar archive, as a Readable stream of
   * its bytes: pipe it to a file (`stream.pipeline(client.exportCheckpoint(id), fs.createWriteStream(f))`).
   * A server error (e.g. CHECKPOINT_NOT_FOUND, NO_WORKSPACE) destroys the stream with a
   * CheckpointdError; an archive is complete only when the stream ends without one.
   * @param {string} checkpointId
   * @param {CallOptions} [options] The deadline covers the whole archive (10 min by default).
   * @returns {import('node:stream').Readable}
   */
  exportCheckpoint(checkpointId, options = {}) {
    const deadline = Date.now() + checkDeadline(options.deadlineMs ?? Math.max(this.deadlineMs, 600_000));
    const call = this.checkpoints.ExportCheckpoint({ checkpointId }, this.metadata(), { deadline });
    async function* archive() {
      try {
        for await (const response of call) yield response.data;
      } catch (error) {
        throw fromServiceError(error, 'ExportCheckpoint');
      }
    }
    const stream = Readable.from(archive(), { objectMode: false });
    stream.on('close', () => call.cancel());
    return stream;
  }

  /**
   * The effective value of one config key.
   * @param {string} key E.g. "core.checkpoints.auto_create_on".
   * @param {{planId?: string, deadlineMs?: number}} [options]
   * @returns {Promise<ConfigEntry>}
   */
  async getConfig(key, options = {}) {
    const response = await this.unary(this.config, 'GetConfig', { key, planId: options.planId ?? '' }, options);
    return this.toConfigEntry(response.entry);
  }

  /**
   * Every registered key with its effective value, sorted by key.
   * @param {{planId?: string, deadlineMs?: number}} [options]
   * @returns {Promise<ConfigEntry[]>}
   */
  async listConfig(options = {}) {
    const response = await this.unary(this.config, 'ListConfig', { planId: options.planId ?? '' }, options);
    return response.entries.map((e) => this.toConfigEntry(e));
  }

  /**
   * Sets (or with `clear`, removes) the global value of a key or one plan's override.
   * @param {string} key
   * @param {*} value Plain JavaScript value matching the key's schema; ignored with clear.
   * @param {{planId?: string, clear?: boolean, deadlineMs?: number}} [options]
   * @returns {Promise<ConfigEntry>}
   */
  async setConfig(key, value, options = {}) {
    const clear = options.clear ?? false;
    const request = { key, value: clear ? null : toValue(value), planId: options.planId ?? '', clear };
    const response = await this.unary(this.config, 'SetConfig', request, options);
    return this.toConfigEntry(response.entry);
  }

  /**
   * Streams the effective values of the keys (all keys when empty): current values first, then
   * each change. Iterate with `for await`; `cancel()` ends the iteration quietly.
   * @param {string[]} [keys]
   * @param {{planId?: string, deadlineMs?: number}} [options]
   * @returns {ConfigWatch}
   */
  watchConfig(keys = [], options = {}) {
    const deadlineMs = checkDeadline(options.deadlineMs ?? this.watchDeadlineMs);
    const call = this.config.WatchConfig({ keys, planId: options.planId ?? '' }, this.metadata(), {
      deadline: deadlineMs === Infinity ? Infinity : Date.now() + deadlineMs,
    });
    return new ConfigWatch(call, (response) => this.toConfigEntry(response.entry));
  }

  unary(stub, method, request, { deadlineMs } = {}) {
    const deadline = Date.now() + checkDeadline(deadlineMs ?? this.deadlineMs);
    return new Promise((resolve, reject) => {
      stub[method](request, this.metadata(), { deadline }, (error, response) => {
        if (error) reject(fromServiceError(error, method));
        else resolve(response);
      });
    });
  }

  metadata() {
    const metadata = new grpc.Metadata();
    if (this.bearerToken) metadata.set('authorization', `Bearer ${this.bearerToken}`);
    return metadata;
  }

  toCheckpoint(checkpoint) {
    return {
      ...checkpoint,
      phase: this.vocabulary.fromWire('Phase', checkpoint.phase),
      trigger: this.vocabulary.fromWire('Trigger', checkpoint.trigger),
      createTime: timestampToDate(checkpoint.createTime),
    };
  }

  toPlan(plan) {
    return {
      ...plan,
      createTime: timestampToDate(plan.createTime),
      updateTime: timestampToDate(plan.updateTime),
    };
  }

  toFileChange(change) {
    return {
      ...change,
      textDiffStatus: this.vocabulary.fromWire('TextDiffStatus', change.textDiffStatus),
      kind: this.vocabulary.fromWire('ChangeKind', change.kind),
      baseType: this.vocabulary.fromWire('EntryType', change.baseType),
      targetType: this.vocabulary.fromWire('EntryType', change.targetType),
    };
  }

  toConfigEntry(entry) {
    return {
      key: entry.key,
      value: fromValue(entry.value),
      source: this.vocabulary.fromWire('ConfigSource', entry.source),
      defaultValue: fromValue(entry.defaultValue),
      description: entry.description,
      planId: entry.planId,
      updateTime: timestampToDate(entry.updateTime),
    };
  }
}

/** A running WatchConfig stream: an async iterable of ConfigEntry. */
class ConfigWatch {
  constructor(call, convert) {
    this.call = call;
    this.convert = convert;
    this.cancelled = false;
  }

  cancel() {
    this.cancelled = true;
    this.call.cancel();
  }

  async *[Symbol.asyncIterator]() {
    try {
      for await (const response of this.call) yield this.convert(response);
    } catch (error) {
      if (this.cancelled && error.code === grpc.status.CANCELLED) return;
      throw fromServiceError(error, 'WatchConfig');
    }
  }
}

function checkDeadline(deadlineMs) {
  if (typeof deadlineMs !== 'number' || Number.isNaN(deadlineMs) || deadlineMs <= 0) {
    throw new RangeError(`a deadline must be a positive number of milliseconds, got ${deadlineMs}`);
  }
  return deadlineMs;
}

module.exports = { CheckpointdClient, ConfigWatch, DEFAULT_DEADLINE_MS, DEFAULT_WATCH_DEADLINE_MS, MAX_RESPONSE_BYTES };
