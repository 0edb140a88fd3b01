'use strict';
/**
 * The checkpoint.v1 contract, loaded at run time from the .proto files (no generated code),
 * and the closed vocabularies derived from it.
 *
 * Enum values are spoken in the project's short form: the lower-case value name without the
 * enum's prefix (TRIGGER_ON_SUBPLAN_SPAWN -> "on_subplan_spawn"). Unknown names are refused
 * with a RangeError listing the known ones, never passed on.
 */

const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

const PACKAGE_DIR = path.resolve(__dirname, '..');
/** The package's own .proto files: google/rpc always, checkpoint/v1 copied in by `npm pack`. */
const PACKAGED_PROTOS = path.join(PACKAGE_DIR, 'protos');
const GOOGLE_RPC_ROOT = PACKAGED_PROTOS;
const CONTRACT_FILES = [
  'checkpoint/v1/checkpoint_service.proto',
  'checkpoint/v1/config_service.proto',
  'checkpoint/v1/errors.proto',
];

/**
 * Where the contract's .proto files live. CHECKPOINTD_PROTOS overrides it. Used in place in a
 * checkout of the repository (this package at clients/node), it reads the repository's protos/,
 * so `npm test` needs no copy and never sees a stale one; installed from its tarball, it reads
 * the copy packed inside it (scripts/pack-protos.js) and nothing outside the package.
 */
function protoRoot() {
  if (process.env.CHECKPOINTD_PROTOS) return process.env.CHECKPOINTD_PROTOS;
  const repository = path.resolve(PACKAGE_DIR, '..', '..');
  const inCheckout =
    path.relative(repository, PACKAGE_DIR) === path.join('clients', 'node') &&
    fs.existsSync(path.join(repository, 'protos', CONTRACT_FILES[0]));
  if (inCheckout) return path.join(repository, 'protos');
  if (fs.existsSync(path.join(PACKAGED_PROTOS, CONTRACT_FILES[0]))) return PACKAGED_PROTOS;
  throw new Error(
    `checkpoint.v1 .proto files not found in ${PACKAGED_PROTOS}: install the package from its npm tarball, ` +
      'use it in place in a checkout of the repository, or set CHECKPOINTD_PROTOS',
  );
}

const PROTO_ROOT = protoRoot();

/**
 * proto-loader options. Field names become lowerCamelCase (planId), int64 becomes Number
 * (every int64 in the contract is a count or a size well below 2^53), enums travel as names.
 */
const LOADER_OPTIONS = Object.freeze({
  keepCase: false,
  longs: Number,
  enums: String,
  bytes: Buffer,
  defaults: true,
  oneofs: true,
  includeDirs: [PROTO_ROOT],
});

/** The triggers a runtime fires by itself; the values core.checkpoints.auto_create_on accepts. */
const AUTO_TRIGGERS = Object.freeze([
  'before_tool_execute',
  'after_tool_execute',
  'on_subplan_spawn',
  'on_error',
]);

let loaded = null;

function loadContract() {
  if (loaded) return loaded;
  const packageDefinition = protoLoader.loadSync(CONTRACT_FILES, LOADER_OPTIONS);
  const grpcObject = grpc.loadPackageDefinition(packageDefinition);
  const vocabulary = new Vocabulary(packageDefinition);
  for (const trigger of AUTO_TRIGGERS) vocabulary.toWire('Trigger', trigger);
  loaded = Object.freeze({
    CheckpointService: grpcObject.checkpoint.v1.CheckpointService,
    ConfigService: grpcObject.checkpoint.v1.ConfigService,
    vocabulary,
    errorReasons: Object.freeze(vocabulary.names('ErrorReason').map((name) => name.toUpperCase())),
    googleRpc: loadGoogleRpc(),
  });
  return loaded;
}

/** google.rpc.Status and google.rpc.ErrorInfo, to decode the grpc-status-details-bin trailer. */
function loadGoogleRpc() {
  const root = new protobuf.Root();
  root.resolvePath = (_origin, target) =>
    target.startsWith('google/protobuf/') ? target : path.resolve(GOOGLE_RPC_ROOT, target);
  root.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto']);
  return {
    Status: root.lookupType('google.rpc.Status'),
    ErrorInfo: root.lookupType('google.rpc.ErrorInfo'),
  };
}

/** Two-way mapping between wire enum names and short names, for every enum of checkpoint.v1. */
class Vocabulary {
  constructor(packageDefinition) {
    this.enums = new Map();
    for (const [fullName, definition] of Object.entries(packageDefinition)) {
      if (!fullName.startsWith('checkpoint.v1.') || !definition.format?.includes('EnumDescriptorProto')) continue;
      const values = definition.type.value;
      const zero = values.find((v) => v.number === 0);
      if (!zero || !zero.name.endsWith('_UNSPECIFIED')) {
        throw new Error(`${fullName} must have a *_UNSPECIFIED zero value`);
      }
      const prefix = zero.name.slice(0, -'UNSPECIFIED'.length);
      const toWire = new Map();
      const fromWire = new Map();
      for (const value of values) {
        if (value.number === 0) continue;
        const short = value.name.slice(prefix.length).toLowerCase();
        toWire.set(short, value.name);
        fromWire.set(value.name, short);
      }
      this.enums.set(fullName.slice('checkpoint.v1.'.length), { prefix, toWire, fromWire });
    }
  }

  /** The short names of an enum, in declaration order, without the unspecified value. */
  names(enumName) {
    return [...this.enum(enumName).toWire.keys()];
  }

  /** Short name -> wire name; refuses unknown names loudly. */
  toWire(enumName, shortName) {
    const wire = this.enum(enumName).toWire.get(shortName);
    if (wire === undefined) {
      throw new RangeError(
        `unknown ${enumName} ${JSON.stringify(shortName)}; known: ${this.names(enumName).join(', ')}`,
      );
    }
    return wire;
  }

  /**
   * Wire name -> short name. The unspecified value becomes null; a value this client does not
   * know (a newer server) stays as it came, so it cannot be mistaken for a known one.
   */
  fromWire(enumName, wireName) {
    const entry = this.enum(enumName);
    if (wireName === `${entry.prefix}UNSPECIFIED` || wireName === 0) return null;
    return entry.fromWire.get(wireName) ?? wireName;
  }

  enum(enumName) {
    const entry = this.enums.get(enumName);
    if (!entry) throw new RangeError(`checkpoint.v1 has no enum ${enumName}`);
    return entry;
  }
}

module.exports = { AUTO_TRIGGERS, CONTRACT_FILES, LOADER_OPTIONS, PROTO_ROOT, Vocabulary, loadContract };
